"""Ranks sharing one cache (issue #52): a shared file tier, claims, tombstones, and a cache that
works without file locks. The counts come from the processes themselves (an O_APPEND log each
compilation writes a line to, and each process's own answer), not from the cache's bookkeeping."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from proteus_rewrite.cache import TOMBSTONE, Entry, StorageCache, decode, encode, make_chain
from proteus_rewrite.errors import CacheError
from proteus_rewrite.file_tier import SharedFileTier
from proteus_rewrite.tiers import open_shared

from ..conftest import run_cli

KEY = hashlib.sha256(b"one variant").hexdigest()
CTX = multiprocessing.get_context("fork")


def _rank(shared: str, local: str, key: str, log: str, out: str, lease: float, compile_s: float,
          barrier=None, host: str | None = None, no_flock: bool = False, fail: bool = False) -> None:
    """One rank: the chain's claim / compile / publish, with a stand-in compile that sleeps
    `compile_s` and appends a line to `log`. Writes what it got to `out`."""
    if host is not None:  # another node, as far as claims can tell
        socket.gethostname = lambda: host
    if no_flock:
        def flock(fd, op):
            raise OSError(errno.ENOSYS, "Function not implemented")
        fcntl.flock = flock
    chain = make_chain(True, local, shared=SharedFileTier(shared, lease_s=lease))
    if barrier is not None:
        barrier.wait()
    t0 = time.monotonic()
    hit = chain.get(key)
    how = hit[1] if hit else None
    data = hit[0].data if hit else None
    kind = hit[0].kind if hit else None
    while hit is None:
        got = chain.acquire(key, wait_s=lease + 10)
        if isinstance(got, tuple):
            data, how, kind = got[0].data, got[1], got[0].kind
            break
        if got is None:
            continue
        try:
            with chain.renewing(got, every_s=max(0.05, lease / 5)):
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, f"{os.getpid()}\n".encode())
                os.close(fd)
                time.sleep(compile_s)
            if fail:
                chain.tombstone(key, 90, "stand-in failure")
                kind, how = TOMBSTONE, "compiled"
            else:
                data = b"variant of " + key.encode()
                chain.put(Entry(key, "cubin", 90, data, {"kernel": "k"}))
                how, kind = "compiled", "cubin"
        finally:
            chain.release(got)
        break
    Path(out).write_text(json.dumps({
        "pid": os.getpid(), "how": how, "kind": kind, "sha": hashlib.sha256(data or b"").hexdigest(),
        "claims": chain.claim_stats, "waited": time.monotonic() - t0}))


def _compilations(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_64_processes_missing_one_key_compile_it_once(tmp_path):
    shared, log = tmp_path / "shared", tmp_path / "compiles.log"
    n = 64
    barrier = CTX.Barrier(n)
    procs = [CTX.Process(target=_rank, args=(str(shared), str(tmp_path / f"node{i % 8}"), KEY, str(log),
                                             str(tmp_path / f"out{i}.json"), 30.0, 0.2, barrier))
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    outs = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(n)]
    assert len(_compilations(log)) == 1
    assert sum(o["how"] == "compiled" for o in outs) == 1
    assert len({o["sha"] for o in outs}) == 1 and outs[0]["sha"] == hashlib.sha256(b"variant of " + KEY.encode()).hexdigest()
    assert sum(o["claims"]["lost"] for o in outs) >= 1  # the others waited rather than compiled


def test_a_killed_claimant_on_this_host_is_taken_over_at_once(tmp_path):
    shared, log = tmp_path / "shared", tmp_path / "compiles.log"
    holder = CTX.Process(target=_rank, args=(str(shared), str(tmp_path / "a"), KEY, str(log), str(tmp_path / "a.json"),
                                              30.0, 60.0))
    holder.start()
    _wait_for(lambda: len(_compilations(log)) == 1)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    t0 = time.monotonic()
    _rank(str(shared), str(tmp_path / "b"), KEY, str(log), str(tmp_path / "b.json"), 30.0, 0.1)
    got = json.loads((tmp_path / "b.json").read_text())
    assert got["how"] == "compiled" and got["claims"]["broken"] >= 1 and len(_compilations(log)) == 2
    assert time.monotonic() - t0 < 10  # well within the 30 s lease: its pid is dead


def test_a_killed_claimant_on_another_node_is_taken_over_after_the_lease(tmp_path):
    shared, log = tmp_path / "shared", tmp_path / "compiles.log"
    lease = 1.5
    holder = CTX.Process(target=_rank, args=(str(shared), str(tmp_path / "a"), KEY, str(log), str(tmp_path / "a.json"),
                                              lease, 60.0, None, "node-a"))
    holder.start()
    _wait_for(lambda: len(_compilations(log)) == 1)
    time.sleep(lease)  # renewing: still its
    assert not (tmp_path / "b.json").exists()
    waiter = CTX.Process(target=_rank, args=(str(shared), str(tmp_path / "b"), KEY, str(log), str(tmp_path / "b.json"),
                                              lease, 0.1, None, "node-b"))
    waiter.start()
    time.sleep(lease + 1)
    assert len(_compilations(log)) == 1  # a live, renewing holder is waited for
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.monotonic()
    holder.join()
    waiter.join(60)
    took = time.monotonic() - killed
    got = json.loads((tmp_path / "b.json").read_text())
    assert got["how"] == "compiled" and got["claims"]["broken"] == 1 and len(_compilations(log)) == 2
    assert lease <= took < lease + 5


def test_entries_are_stored_where_flock_fails_with_enosys(tmp_path):
    log = tmp_path / "compiles.log"
    for i in range(2):
        p = CTX.Process(target=_rank, kwargs=dict(shared=str(tmp_path / "shared"), local=str(tmp_path / "local"), key=KEY,
                                                  log=str(log), out=str(tmp_path / f"{i}.json"), lease=30.0,
                                                  compile_s=0.0, no_flock=True))
        p.start()
        p.join(60)
        assert p.exitcode == 0
    first, second = (json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2))
    assert first["how"] == "compiled" and second["how"] == "disk" and len(_compilations(log)) == 1
    assert StorageCache(tmp_path / "local").get(KEY) is not None
    assert SharedFileTier(tmp_path / "shared").get(KEY) is not None


def test_a_damaged_shared_entry_is_a_miss_left_alone_while_young_and_quarantined_when_old(tmp_path):
    tier = SharedFileTier(tmp_path)
    tier.put(Entry(KEY, "cubin", 90, b"x" * 1000))
    path = tier.path(KEY)
    path.write_bytes(path.read_bytes()[:500])  # what a reader may see of another node's publish
    reader = SharedFileTier(tmp_path)
    assert reader.get(KEY) is None and path.exists() and reader.stats.corrupt == 1 and reader.stats.misses == 1
    old = time.time() - 20 * 60
    os.utime(path, (old, old))
    assert reader.get(KEY) is None and not path.exists() and reader.stats.quarantined == 1
    assert len(list((tmp_path / "quarantine").iterdir())) == 1


def test_a_tombstone_stops_other_processes_from_retrying(tmp_path):
    shared, log = tmp_path / "shared", tmp_path / "compiles.log"
    _rank(str(shared), str(tmp_path / "a"), KEY, str(log), str(tmp_path / "a.json"), 30.0, 0.0, fail=True)
    for name in "bc":
        p = CTX.Process(target=_rank, args=(str(shared), str(tmp_path / name), KEY, str(log), str(tmp_path / f"{name}.json"),
                                             30.0, 0.0))
        p.start()
        p.join(60)
        got = json.loads((tmp_path / f"{name}.json").read_text())
        assert got["kind"] == TOMBSTONE and got["how"] == "shared"
    assert len(_compilations(log)) == 1


def test_the_specializer_publishes_a_tombstone_and_does_not_compile_it_again(table, tmp_path):
    from proteus_rewrite.errors import SpecializeError
    from proteus_rewrite.jit.specializer import FailedElsewhere, specialize

    from .test_specializer import CFG, kernel, launch_for

    class Failing:
        calls = 0

        def compile(self, *args):
            Failing.calls += 1
            raise SpecializeError("the specialized module does not verify: stand-in")

    t = table("device_globals")
    k = kernel(t, "apply")
    launch = launch_for(k, {2: "10"}, globals_={"hits": 0x1000, "table": 0x2000, "coeffs": 0x3000})

    def chain(node):
        return make_chain(True, str(tmp_path / node), shared=SharedFileTier(tmp_path / "shared"))

    with pytest.raises(SpecializeError, match="does not verify"):
        specialize(t, k, launch, CFG, cache=chain("a"), compiler=Failing())
    with pytest.raises(FailedElsewhere, match="does not verify"):
        specialize(t, k, launch, CFG, cache=chain("b"), compiler=Failing())  # another node
    assert Failing.calls == 1


def test_the_specializer_raises_claimed_elsewhere_when_told_not_to_wait(table, tmp_path):
    from proteus_rewrite.jit.specializer import ClaimedElsewhere, CompileBudgetSpent, specialize

    from .test_specializer import CFG, kernel, launch_for

    t = table("device_globals")
    k = kernel(t, "apply")
    launch = launch_for(k, {2: "10"}, globals_={"hits": 0x1000, "table": 0x2000, "coeffs": 0x3000})
    other = make_chain(True, str(tmp_path / "a"), shared=SharedFileTier(tmp_path / "shared"))
    mine = make_chain(True, str(tmp_path / "b"), shared=SharedFileTier(tmp_path / "shared"))
    with pytest.raises(CompileBudgetSpent) as spent:
        specialize(t, k, launch, CFG, cache=other, may_compile=False)
    held = other.claim(spent.value.key)  # another node compiles it
    assert held is not None
    with pytest.raises(ClaimedElsewhere) as info:
        specialize(t, k, launch, CFG, cache=mine, claim_wait_s=0, compiler=_Never())
    assert info.value.key == spent.value.key and mine.claim_stats["lost"] == 1
    other.release(held)


class _Never:
    def compile(self, *args):
        raise AssertionError("compiled")


def test_hmac_entries_are_refused_without_a_valid_signature(tmp_path):
    e = Entry(KEY, "cubin", 90, b"payload", {"kernel": "k"})
    raw = encode(e, b"secret")
    assert decode(raw, KEY, b"secret") == e and decode(raw, KEY) == e
    assert decode(raw, KEY, b"other") is None and decode(encode(e), KEY, b"secret") is None
    SharedFileTier(tmp_path).put(e)  # unsigned
    signed = SharedFileTier(tmp_path, secret=b"secret")
    assert signed.get(KEY) is None and signed.stats.refused == 1 and signed.path(KEY).exists()
    signed.put(e)
    assert signed.get(KEY) == e


def test_group_sharing_modes_with_umask_002(tmp_path):
    tier = SharedFileTier(tmp_path / "s", umask=0o002)
    tier.put(Entry(KEY, "cubin", 90, b"x"))
    assert tier.path(KEY).stat().st_mode & 0o777 == 0o664
    assert tier.path(KEY).parent.stat().st_mode & 0o7777 == 0o2775
    private = SharedFileTier(tmp_path / "p")
    private.put(Entry(KEY, "cubin", 90, b"x"))
    assert private.path(KEY).stat().st_mode & 0o777 == 0o600


def test_hits_write_nothing_and_trim_evicts_oldest(tmp_path):
    tier = SharedFileTier(tmp_path)
    keys = [hashlib.sha256(bytes([i])).hexdigest() for i in range(4)]
    for i, k in enumerate(keys):
        tier.put(Entry(k, "cubin", 90, b"x" * 400_000))
        os.utime(tier.path(k), (1000 + i, 1000 + i))
    before = tier.path(keys[0]).stat().st_mtime
    assert tier.get(keys[0]) is not None and tier.path(keys[0]).stat().st_mtime == before
    assert tier.path(keys[0]).parent.name == keys[0][:2]
    assert tier.trim(1.0) == 2 and tier.get(keys[0]) is None and tier.get(keys[3]) is not None


def test_a_shared_hit_fills_the_node_local_tier(tmp_path):
    SharedFileTier(tmp_path / "s").put(Entry(KEY, "cubin", 90, b"x"))
    chain = make_chain(True, str(tmp_path / "local"), shared=SharedFileTier(tmp_path / "s"))
    assert chain.get(KEY)[1] == "shared" and chain.claim_stats["shared_hits"] == 1
    assert StorageCache(tmp_path / "local").get(KEY) is not None


def test_open_shared_urls(tmp_path):
    assert isinstance(open_shared(f"file://{tmp_path}"), SharedFileTier)
    with pytest.raises(CacheError, match="scheme"):
        open_shared("s3://bucket/x")
    with pytest.raises(CacheError, match="local path"):
        open_shared("file://host/x")


def test_threads_of_one_process_claim_once(tmp_path):
    chain = make_chain(True, str(tmp_path))
    first = chain.claim(KEY)
    assert first is not None and chain.claim(KEY) is None
    chain.release(first)
    assert chain.claim(KEY) is not None


def _wait_for(cond, timeout=30.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout
        time.sleep(0.02)


def test_12_concurrent_prewarms_on_one_cold_shared_cache_compile_each_variant_once(samples, tmp_path):
    import re
    import subprocess
    import sys

    from ..conftest import ROOT

    out = tmp_path / "out"
    assert run_cli(str(samples / "two_tu_shared"), "-o", str(out)).returncode == 0

    def launch(args: dict[str, bytes], grid: int, block: int) -> dict:
        return {"args": {i: v.hex() for i, v in args.items()}, "arch": 90, "grid": [grid, 1, 1], "block": [block, 1, 1],
                "globals": {}}

    def n(v: int) -> bytes:
        return v.to_bytes(4, "little")

    variants = [("_Z6squarePfi", {"1": n(1 << s)}) for s in (16, 18, 20)]
    variants += [("_Z9histogramPKfiPji", {"1": n(1 << 20), "3": n(b)}) for b in (32, 64)]
    report = {"driver_version": 13000, "kernels": [{"name": name, "variants": [{"launch": launch(a, 4096, 256)}]}
                                                   for name, a in variants]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    code = "import sys; from proteus_rewrite.cli import run; sys.argv[0] = 'proteus-rewrite'; run()"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PROTEUS_CACHE_SHARED=f"file://{tmp_path / 'shared'}")
    procs = [subprocess.Popen([sys.executable, "-c", code, "prewarm", str(out), "--from", str(path), "--cache-dir",
                               str(tmp_path / f"node{i}")], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                              env=env) for i in range(12)]
    errs = [p.communicate(timeout=580)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    compiled = [int(m.group(1)) if (m := re.search(r"prewarm: (\d+) compiled", e)) else 0 for e in errs]
    assert sum(compiled) == len(variants), errs
