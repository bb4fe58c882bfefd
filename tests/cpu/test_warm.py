"""A warm run's first launches (runtime/warm.py): the note a run leaves of the launches its
variants served, and what the next run's prestart thread is told to load ahead from it. The
loading itself is the shim's (shim/cuda_warm.c: tests/shim/test_shim.c, and on the GPU
tests/gpu/test_gpu_shim.py)."""

from __future__ import annotations

import ctypes
import struct

import pytest

from proteus_rewrite import runtime
from proteus_rewrite.cache import StorageCache
from proteus_rewrite.fatbin import hostelf
from proteus_rewrite.jit.launch import parse_value
from proteus_rewrite.policy import WARM_KIND, decode_warm, encode_warm
from proteus_rewrite.runtime import protocol

from ..conftest import run_cli
from ..support.launches import kernel

GRID, BLOCK = (4, 1, 1), (256, 1, 1)


@pytest.fixture
def app(samples, tmp_path, monkeypatch):
    """loop_count's store, its fat binary at a real address (as the shim hands it over), and a
    'run': the run time initialized anew with axpy_loop resolved as the shim's first launch would."""
    exe = samples / "loop_count"
    assert run_cli(str(exe), "-o", str(tmp_path / "out")).returncode == 0
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    monkeypatch.setenv("PROTEUS_PRELOAD", "1")
    data = hostelf.parse(exe.read_bytes()).sections[hostelf.CUDA_FATBIN].data
    buf = ctypes.create_string_buffer(data, len(data))

    def run():
        runtime.reset()
        assert runtime.init(str(tmp_path / "out"), 13000)
        st = runtime.state()
        k = kernel(st.tables[0], "axpy_loop")
        kid = struct.unpack_from("<I", runtime.kernel_info(ctypes.addressof(buf), k.name, 90))[0]
        return st, k, kid

    yield run, ctypes.addressof(buf), tmp_path / "out"
    runtime.reset()


def _args(k, n: str) -> bytes:
    return b"".join(parse_value(p, n) if p.index == 1 else bytes(p.size) for p in k.params)


def _items(answer: bytes) -> list[tuple]:
    """protocol.WARM_ITEM records: (image, grid, block, arch, name, known, args, kernel_info's answer, image answer)."""
    out, at = [], 0
    while at < len(answer):
        image, *dims, arch, nparams, nname, nargs, ninfo, nanswer = protocol.WARM_ITEM.unpack_from(answer, at)
        at += protocol.WARM_ITEM.size
        parts = []
        for n in (nname, nparams, nargs, ninfo, nanswer):
            parts.append(answer[at:at + n])
            at += n
        out.append((image, tuple(dims[:3]), tuple(dims[3:]), arch, parts[0].decode(), *parts[1:]))
    return out


def test_the_next_run_is_told_the_launches_whose_variants_this_run_used(app):
    run, address, _ = app
    st, k, kid = run()
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)) == b""  # a first run: no note yet
    assert runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)  # compiled, and in the disk cache
    folded = sorted(int(i) for i in st.stats[kid].variants[0]["launch"]["args"])
    assert 1 in folded and all(k.params[i].kind != "pointer" for i in folded)
    runtime.finish()

    runtime.reset()
    assert runtime.init(str(app[2]), 13000)  # a new run, no kernel resolved yet: as the prestart thread finds it
    st = runtime.state()
    (item,) = _items(runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)))
    image, grid, block, arch, name, known, args, info, answer = item
    assert (image, grid, block, arch, name) == (address, GRID, BLOCK, 90, k.name)
    assert [i for i, b in enumerate(known) if b] == folded  # the folded arguments, and only they, are the launch's
    assert args == _args(k, "3")  # (the others zero: pointers are never noted)
    # what the kernel's first launch would have asked, answered ahead: which kernel it is, and its variant
    (kid,) = struct.unpack_from("<I", info)
    assert st.kernels[kid][1].name == k.name and info[protocol.KERNEL_INFO.size + 4 * len(k.params):][:len(k.params)] == known
    entry, image_bytes, vid, _flags = protocol.split_image_answer(answer)
    assert image_bytes and vid == 1 and entry.startswith(k.name)
    v = st.stats[kid].variants[-1]
    assert v["source"] == "disk" and v["loaded_ahead"] is True


def test_loading_ahead_never_queues_a_compilation(app):
    run, _, _ = app
    st, k, kid = run()
    assert runtime.specialize(kid, _args(k, "7"), GRID, BLOCK, b"", 90, 0.0, protocol.CACHED_AHEAD) == b""
    assert st.stats[kid].queued == {} and runtime.compiled_this_run() == 0
    assert runtime.specialize(kid, _args(k, "7"), GRID, BLOCK, b"", 90, 0.0, protocol.CACHED_ONLY) == b""
    assert len(st.stats[kid].queued) == 1  # a miss's: the shim queues it


def test_a_steady_run_does_not_write_the_note_again(app, monkeypatch):
    run, address, _ = app
    st, k, kid = run()
    runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)
    runtime.finish()
    puts = []
    real_put = StorageCache.put
    monkeypatch.setattr(StorageCache, "put", lambda self, e, enforce_cap=True: (puts.append(e.kind), real_put(self, e, enforce_cap)))
    for ahead in (True, False):  # read ahead by the prestart thread, or only at exit
        st, k, kid = run()
        if ahead:
            runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address))
        runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)
        runtime.finish()
    assert WARM_KIND not in puts
    st, k, kid = run()  # another value: the note changes
    runtime.specialize(kid, _args(k, "4"), GRID, BLOCK, b"", 90)
    runtime.finish()
    assert puts.count(WARM_KIND) == 1


def test_an_image_of_no_store_gets_nothing(app):
    run, address, _ = app
    st, k, kid = run()
    runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)
    runtime.finish()
    run()
    other = ctypes.create_string_buffer(b"\x00" * 4096)
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(ctypes.addressof(other))) == b""


def test_a_malformed_note_is_skipped_item_by_item():
    good = {"fatbin": "ab" * 32, "kernel": "_Z1kv", "arch": 90, "args": {"1": "03000000"}, "grid": [4, 1, 1], "block": [256, 1, 1]}
    assert decode_warm(encode_warm([good])) == [good]
    assert decode_warm(b"not json") == [] and decode_warm(b'{"a": 1}') == []
    bad = [{**good, "grid": [0, 1, 1]}, {**good, "block": [256, 1]}, {**good, "args": {"x": "03"}},
           {**good, "args": {"1": "zz"}}, {**good, "arch": "90"}, {k: v for k, v in good.items() if k != "kernel"}, 7]
    assert decode_warm(encode_warm(bad + [good])) == [good]


def test_without_preloading_no_note_is_written(app, monkeypatch):
    run, address, _ = app
    monkeypatch.setenv("PROTEUS_PRELOAD", "0")
    st, k, kid = run()
    runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)
    runtime.finish()
    run()
    monkeypatch.setenv("PROTEUS_PRELOAD", "1")
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)) == b""


def test_without_a_note_no_fat_binary_is_read(app, monkeypatch):
    """The prestart thread asks about every fat binary of the loaded objects (a cuBLAS's among
    them): with nothing noted, none is hashed, and the note is looked up once."""
    run, address, _ = app
    st, _, _ = run()
    read = []
    monkeypatch.setattr(st, "image", lambda ptr: read.append(ptr))
    lookups = []
    disk = next(level for level in runtime.state().cache.levels if isinstance(level, StorageCache))
    real_get = disk.get
    monkeypatch.setattr(disk, "get", lambda *a, **kw: lookups.append(a) or real_get(*a, **kw))
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)) == b""
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address + 64)) == b""
    assert read == [] and len(lookups) == 1


def test_two_noted_variants_of_a_kernel_share_its_one_id(app):
    """The shim loads a noted variant only for the kernel id it resolved the kernel with (the
    first item's): every item of a kernel carries that id."""
    run, address, _ = app
    st, k, kid = run()
    for n in ("3", "5"):
        assert runtime.specialize(kid, _args(k, n), GRID, BLOCK, b"", 90)
    runtime.finish()
    runtime.reset()
    assert runtime.init(str(app[2]), 13000)
    items = _items(runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)))
    assert len(items) == 2 and len({struct.unpack_from("<I", it[7])[0] for it in items}) == 1
    assert {it[6] for it in items} == {_args(k, "3"), _args(k, "5")}


def test_noted_launches_one_variant_under_this_runs_policy_are_answered_once(app, monkeypatch):
    """Two noted launches that differ only in an argument this run does not fold are one key in
    the shim: answered once, so the report lists the variant once."""
    run, address, _ = app
    monkeypatch.setenv("PROTEUS_SPECIALIZE_ARGS", "0")
    st, k, kid = run()
    assert runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)  # the unfolded variant, cached
    runtime.finish()
    monkeypatch.delenv("PROTEUS_SPECIALIZE_ARGS")
    st, k, kid = run()
    for n in ("3", "5"):
        assert runtime.specialize(kid, _args(k, n), GRID, BLOCK, b"", 90)
    runtime.finish()  # notes both
    monkeypatch.setenv("PROTEUS_SPECIALIZE_ARGS", "0")
    runtime.reset()
    assert runtime.init(str(app[2]), 13000)
    (item,) = _items(runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)))
    kid = struct.unpack_from("<I", item[7])[0]
    assert len(runtime.state().stats[kid].variants) == 1


def test_with_upstreams_cache_trace_nothing_is_answered_ahead(app, monkeypatch):
    """PROTEUS_TRACE_OUTPUT=cache-stats: upstream prints a storage hit at the launch that meets
    it, after the program's own first lines (its dim_spec_cache_test checks that order); an
    answer made ahead would print it before them."""
    run, address, _ = app
    st, k, kid = run()
    runtime.specialize(kid, _args(k, "3"), GRID, BLOCK, b"", 90)
    runtime.finish()
    monkeypatch.setenv("PROTEUS_TRACE_OUTPUT", "cache-stats")
    run()
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)) == b""
    monkeypatch.delenv("PROTEUS_TRACE_OUTPUT")
    run()
    assert runtime.warm_set(protocol.IMAGE_ADDRESS.pack(address)) != b""
