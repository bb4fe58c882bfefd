"""The code cache: hits and misses per level, damaged entries, many processes, the size cap."""

from __future__ import annotations

import multiprocessing
import os
import time

from proteus_rewrite import cache as cache_mod
from proteus_rewrite.cache import Entry, StorageCache, make_chain
from proteus_rewrite.jit import Config, specialize

from ..support.launches import kernel, launch_for

CFG = Config.from_env({})


def test_miss_then_memory_hit_then_disk_hit_in_a_new_process_chain(table, tmp_path):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    launch = launch_for(k, {0: "1000", 1: "8", 2: "0.5"})
    chain = make_chain(True, str(tmp_path))
    first = specialize(t, k, launch, CFG, chain)
    second = specialize(t, k, launch, CFG, chain)
    assert (first.source, second.source) == ("compiled", "memory")
    assert second.image.data == first.image.data
    fresh = make_chain(True, str(tmp_path))  # what the next run of the app sees
    third = specialize(t, k, launch, CFG, fresh)
    assert third.source == "disk" and third.image.data == first.image.data
    assert fresh.stats()["memory"].puts == 1  # promoted to the first level
    other = specialize(t, k, launch_for(k, {0: "1000", 1: "9", 2: "0.5"}), CFG, fresh)
    assert other.source == "compiled"


def test_stored_cache_can_be_turned_off(table, tmp_path):
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    chain = make_chain(False, str(tmp_path))
    specialize(t, k, launch_for(k, {1: "5"}), CFG, chain)
    assert list(tmp_path.iterdir()) == []


def test_damaged_entry_is_discarded_and_rebuilt(table, tmp_path):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    launch = launch_for(k, {0: "1000", 1: "8", 2: "0.5"})
    first = specialize(t, k, launch, CFG, make_chain(True, str(tmp_path)))
    path = StorageCache(tmp_path).path(first.key)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    chain = make_chain(True, str(tmp_path))
    again = specialize(t, k, launch, CFG, chain)
    assert again.source == "compiled" and again.image.data == first.image.data
    assert chain.stats()["disk"].corrupt == 1
    assert cache_mod.decode(path.read_bytes(), first.key) is not None  # rewritten whole


def test_truncated_or_foreign_files_are_not_entries(tmp_path):
    entry = Entry("k" * 64, "cubin", 90, b"\x7fELF" + bytes(100), {"kernel": "x"})
    raw = cache_mod.encode(entry)
    assert cache_mod.decode(raw, entry.key) == entry
    assert cache_mod.decode(raw[:-1]) is None
    assert cache_mod.decode(b"garbage" * 10) is None
    assert cache_mod.decode(raw, "other-key") is None


def test_a_hit_touches_its_entry_only_when_its_time_is_old(tmp_path):
    """The LRU order costs a metadata write per hit only where it would change something:
    an entry used within the hour keeps its time; an older one is brought up to now."""
    store = StorageCache(tmp_path)
    store.put(Entry("a" * 64, "cubin", 90, b"x"))
    p = store.path("a" * 64)
    young = time.time() - 60
    os.utime(p, (young, young))
    assert store.get("a" * 64) is not None and p.stat().st_mtime == young
    os.utime(p, (1000, 1000))
    assert store.get("a" * 64) is not None and p.stat().st_mtime > time.time() - 60


def test_size_cap_evicts_least_recently_used(tmp_path):
    store = StorageCache(tmp_path, max_mb=1)
    blob = bytes(300 * 1024)
    for i in range(3):
        store.put(Entry(f"{i:064d}", "cubin", 90, blob))
        os.utime(store.path(f"{i:064d}"), (1000 + i, 1000 + i))
    assert store.get(f"{0:064d}") is not None  # touch the oldest: now the most recent
    store.put(Entry(f"{3:064d}", "cubin", 90, blob))  # 4 x 300 KiB > 1 MiB
    left = sorted(p.name[63] for p, _ in store.entries())  # the last digit of each key
    assert sum(st.st_size for _, st in store.entries()) <= 1024 * 1024
    assert left == ["0", "2", "3"]  # 1 was the least recently used
    assert store.stats.evicted >= 1


def test_a_put_without_the_cap_check_reads_no_other_entry(tmp_path, monkeypatch):
    """A tracker decision is written on the launching thread: it takes no lock that other
    processes share, nor reads any other entry. The next ordinary put keeps the cap."""
    from proteus_rewrite.cache import CacheChain, MemoryCache

    store = StorageCache(tmp_path, max_mb=1)
    for i in range(4):
        store.put(Entry(f"{i:064d}", "cubin", 90, bytes(300 * 1024)), enforce_cap=False)
    assert sum(st.st_size for _, st in store.entries()) > 1024 * 1024  # over the cap, for now
    scans = []
    monkeypatch.setattr(StorageCache, "entries", lambda self: scans.append(1) or [])
    CacheChain([MemoryCache(), store]).put(Entry("p" * 64, "policy", 90, b"\x01"), enforce_cap=False)
    assert scans == [] and store.get("p" * 64) is not None
    monkeypatch.undo()
    store.put(Entry(f"{4:064d}", "cubin", 90, b"x"))
    assert sum(st.st_size for _, st in store.entries()) <= 1024 * 1024 and store.stats.evicted >= 1


def test_unwritable_cache_does_not_stop_specialization(table, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    r = specialize(t, k, launch_for(k, {1: "5"}), CFG, make_chain(True, str(blocker / "cache")))
    assert r.source == "compiled"


def _worker(args):
    directory, worker = args
    from proteus_rewrite.fatbin import extract
    from proteus_rewrite.jit import Config, Launch, specialize
    from proteus_rewrite.jit.launch import parse_value

    t = extract(os.path.join(os.path.dirname(__file__), "..", "..", "samples", "build", "loop_count"))
    k = next(k for k in t.kernels if k.name == "_Z9axpy_loopiifPKfPf")
    sources = []
    for iters in range(1, 7):  # the same six variants in every process: maximal contention
        vals = {0: "4096", 1: str((iters + worker) % 6 + 1), 2: "0.5"}
        raw = tuple(parse_value(p, vals[p.index]) if p.index in vals else bytes(p.size) for p in k.params)
        chain = __import__("proteus_rewrite.cache", fromlist=["make_chain"]).make_chain(True, directory)
        sources.append(specialize(t, k, Launch(raw, (16, 1, 1), (256, 1, 1), 90), Config.from_env({}), chain).source)
    return sources


def test_eight_processes_fill_one_cache_directory_without_a_damaged_entry(samples, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        results = pool.map(_worker, [(str(tmp_path), w) for w in range(8)])
    assert all(len(r) == 6 for r in results)
    files = [p for p in tmp_path.iterdir() if p.name.endswith(".pjc")]
    assert len(files) == 6
    for p in files:
        assert cache_mod.decode(p.read_bytes(), p.name[:-4]) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def _filler(args):
    directory, worker = args
    from proteus_rewrite.cache import Entry, StorageCache

    store = StorageCache(directory, max_mb=0.1)
    for i in range(60):  # distinct keys, 3-9 KiB each: 16 x 60 entries, about 30 times the cap
        store.put(Entry(f"{worker:032d}{i:032d}", "cubin", 90, os.urandom(3072 * (1 + (worker + i) % 3))))
    return store.stats.evicted


def test_sixteen_processes_keep_the_cap_and_its_count_exact(tmp_path):
    """What the GPU stress test does through the shim, without a GPU: the directory ends under
    its cap, and .usage is the entries' exact total."""
    with multiprocessing.get_context("spawn").Pool(16) as pool:
        evicted = pool.map(_filler, [(str(tmp_path), w) for w in range(16)])
    sizes = [st.st_size for _, st in StorageCache(tmp_path).entries()]
    assert 0 < sum(sizes) <= 0.1 * 1024 * 1024 and sum(evicted) > 0
    assert int((tmp_path / cache_mod.USAGE).read_text()) == sum(sizes)
    assert not list(tmp_path.glob(".tmp-*"))


def test_puts_keep_a_count_instead_of_reading_every_entry(tmp_path, monkeypatch):
    """Summing every entry's size takes 12 ms at 1,000 entries (bench/micro/cache_bench.py): a put
    adds to .usage instead, recounting only when it is missing or damaged."""
    store = StorageCache(tmp_path, max_mb=1)
    scans = []
    real = StorageCache.entries
    monkeypatch.setattr(StorageCache, "entries", lambda self: scans.append(1) or real(self))
    for i in range(20):
        store.put(Entry(f"{i:064d}", "cubin", 90, bytes(1000 + i)))
    assert len(scans) == 1  # the first put: no count yet
    assert int((tmp_path / cache_mod.USAGE).read_text()) == sum(1000 + i for i in range(20)) + 20 * _overhead()
    store.put(Entry(f"{0:064d}", "cubin", 90, bytes(10)))  # replacing an entry subtracts the old one
    assert int((tmp_path / cache_mod.USAGE).read_text()) == sum(st.st_size for _, st in real(store))
    (tmp_path / cache_mod.USAGE).write_text("garbage")
    store.put(Entry(f"{99:064d}", "cubin", 90, bytes(10)))
    assert len(scans) == 2 and int((tmp_path / cache_mod.USAGE).read_text()) == sum(st.st_size for _, st in real(store))
    assert store.clear() == 21 and not (tmp_path / cache_mod.USAGE).exists()


def _overhead() -> int:
    return len(cache_mod.encode(Entry("k" * 64, "cubin", 90, b"")))


def test_cache_directory_is_private_to_the_user(tmp_path):
    store = StorageCache(tmp_path / "new" / "jit")
    store.put(Entry("k" * 64, "cubin", 90, b"x"))
    assert (store.dir.stat().st_mode & 0o777) == 0o700


def test_stores_and_caches_are_read_as_data_never_as_code():
    """No pickle, marshal or eval of anything a user could swap: the only pickles are the
    result of bitcode analysis coming back from our own forked child, and the frames between
    the run time and its own compiler process (a socket pair only the two hold)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "proteus_rewrite"
    for path in root.rglob("*.py"):
        text = path.read_text()
        for needle in ("marshal.load", "eval(", "exec(", "shelve", "yaml.load"):
            assert needle not in text, f"{path}: {needle}"
        if "import pickle" in text:
            assert path.name in ("common.py", "process.py") and text.count("pickle.loads(") == 1, path

def test_size_cap_takes_fractions_of_a_megabyte_and_rejects_nonsense():
    import pytest

    from proteus_rewrite.errors import SpecializeError
    assert Config.from_env({"PROTEUS_CACHE_MAX_MB": "0.25"}).cache_max_mb == 0.25
    for bad in ("0", "-1", "lots", "inf"):
        with pytest.raises(SpecializeError, match="PROTEUS_CACHE_MAX_MB"):
            Config.from_env({"PROTEUS_CACHE_MAX_MB": bad})
