"""HIP through the code paths CUDA built first: `inspect`'s table, `specialize` to a code object,
the run-time half's kernel_info/specialize/load_failed with a processor name for the arch, the
JIT cache holding code objects, prewarm, and the Makefile's samples target. CPU only: every
code object is checked with LLVM's tools, never loaded (docs/user/hip.md)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proteus_rewrite import runtime, store
from proteus_rewrite.cache import Entry, StorageCache, decode, describe, encode
from proteus_rewrite.fatbin import extract, hostelf, layouts, offload_bundle
from proteus_rewrite.jit import Config, Launch, codegen, specializer
from proteus_rewrite.jit.targets import best_record
from proteus_rewrite.policy import decode_run, run_key
from proteus_rewrite.runtime import protocol

from ..conftest import ROOT, run_cli
from ..support.hip_samples import hip_samples

OBJDUMP = shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")
READELF = shutil.which("llvm-readelf-19") or shutil.which("llvm-readelf")
AXPY = "_Z9axpy_loopiifPKfPf"
EM_AMDGPU = 224


def _lld():
    try:
        codegen.lld_path()
    except Exception as exc:
        pytest.skip(str(exc))


def _is_code_object(data: bytes, arch: str = "gfx90a") -> None:
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == EM_AMDGPU
    from proteus_rewrite.fatbin import amdgpu_codeobj

    assert amdgpu_codeobj.parse(data).arch == arch


def _fmas(path: Path) -> int:
    if not OBJDUMP:
        pytest.skip("needs llvm-objdump (apt-get install llvm-19)")
    asm = subprocess.run([OBJDUMP, "-d", "--mcpu=gfx90a", str(path)], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"v_fmac?_f32\S*\s+v\d+, 0\.5,", asm))


# ---------------------------------------------------------------- the command line


def test_inspect_names_hip_and_the_processors():
    proc = run_cli("inspect", str(hip_samples() / "loop_count"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "  hip" in out.splitlines()[0] and "cudart" not in out
    assert "hipv4 gfx90a, hipv4 gfx940" in out and "bytes of bitcode, gfx90a" in out
    assert "sm_gfx" not in out and "sm_x86" not in out
    assert re.search(r"\barch\b", out.splitlines()[4]) and "gfx90a" in out


def test_inspect_of_a_cuda_app_is_unchanged_but_for_the_column_name(samples):
    proc = run_cli("inspect", str(samples / "loop_count"))
    assert proc.returncode == 0, proc.stderr
    assert "cudart: static" in proc.stdout and "ELF sm_90" in proc.stdout and "bitcode, sm_90" in proc.stdout
    assert re.search(r"\barch\b", proc.stdout)


def test_specialize_writes_a_code_object_with_the_loop_folded(tmp_path):
    _lld()
    out = tmp_path / "axpy.co"
    proc = run_cli("specialize", str(hip_samples() / "loop_count"), "axpy_loop", "--arg", "0=1048576", "--arg", "1=8",
                   "--arg", "2=0.5", "--block", "256", "--arch", "gfx90a", "--emit", "codeobj", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "(gfx90a)" in proc.stderr and "amdgpu-flat-work-group-size 1,256" in proc.stderr
    assert re.search(r"time .* object [\d.]+ ms, link [\d.]+ ms", proc.stderr)
    data = out.read_bytes()
    _is_code_object(data)
    assert _fmas(out) == 8


def test_specialize_defaults_to_the_first_processor_and_to_ir():
    proc = run_cli("specialize", str(hip_samples() / "loop_count"), "axpy_loop", "--arg", "1=8")
    assert proc.returncode == 0, proc.stderr
    assert "(gfx90a)" in proc.stderr
    assert 'target triple = "amdgcn-amd-amdhsa"' in proc.stdout and "define amdgpu_kernel" in proc.stdout


@pytest.mark.parametrize("args, code, message", [
    (("--arch", "gfx942"), 6, "no recorded bitcode for gfx942 (it has for gfx90a, gfx940)"),
    (("--arch", "gfx940", "--emit", "codeobj", "-o", "/dev/null"), 9, "gfx940 is not a processor llvmlite's LLVM 22 knows"),
    (("--arch", "sm_90"), 2, "a HIP app needs an AMDGPU processor"),
    (("--emit", "ptx"), 2, "'ptx' is not what a HIP kernel compiles to"),
])
def test_specialize_refuses_what_a_hip_kernel_cannot_be(args, code, message):
    proc = run_cli("specialize", str(hip_samples() / "loop_count"), "axpy_loop", "--arg", "1=8", *args)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr


def test_specialize_refuses_codeobj_and_gfx_for_a_cuda_app(samples):
    proc = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", "--arch", "gfx90a")
    assert proc.returncode == 2 and "a CUDA app needs sm_XX" in proc.stderr
    proc = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", "--emit", "codeobj")
    assert proc.returncode == 2 and "'codeobj' is not what a CUDA kernel compiles to" in proc.stderr


def test_prewarm_compiles_a_hip_variant_from_a_report(tmp_path):
    _lld()
    kstore = store.write(extract(hip_samples() / "loop_count"), tmp_path / "loop_count.kstore")
    report = {"driver_version": 0, "kernels": [{"name": AXPY, "variants": [{"launch": {
        "args": {"1": (8).to_bytes(4, "little").hex(), "2": struct.pack("<f", 0.5).hex()},
        "unknown_dims": ["grid"], "arch": "gfx90a", "block": [256, 1, 1], "grid": [4096, 1, 1], "globals": {}}}]}]}
    (tmp_path / "run.json").write_text(json.dumps(report))
    proc = run_cli("prewarm", str(kstore), "--from", str(tmp_path / "run.json"), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "1 compiled" in proc.stderr
    entries = sorted((decode(p.read_bytes()) for p in (tmp_path / "cache").rglob("*.pjc")), key=lambda e: e.kind)
    # the variant, and the note that the next run compiles nothing (its compiler is left cold)
    assert [(e.kind, e.arch) for e in entries] == [("codeobj", "gfx90a"), ("run", 0)]
    table = extract(hip_samples() / "loop_count")
    assert entries[1].key == run_key([f.sha256 for f in table.fatbins]) and decode_run(entries[1].data) == 0
    _is_code_object(entries[0].data)
    ls = run_cli("cache", "ls", "--dir", str(tmp_path / "cache"))
    assert ls.returncode == 0 and "codeobj" in ls.stdout and "gfx90a" in ls.stdout


def test_prewarm_compiles_what_the_next_run_asks_for_once_the_tracker_stopped_folding(tmp_path):
    """The report's variants folded argument 1 (8, then 9) before the tracker stopped folding it;
    the next run starts with it unfolded, so prewarm compiles that one variant, not the two."""
    from proteus_rewrite.cache import make_chain

    _lld()
    kstore = store.write(extract(hip_samples() / "loop_count"), tmp_path / "loop_count.kstore")
    def variant(iters):
        return {"launch": {"args": {"0": (1 << 20).to_bytes(4, "little").hex(), "1": iters.to_bytes(4, "little").hex(),
                                    "2": struct.pack("<f", 0.5).hex()},
                           "unknown_dims": ["grid"], "arch": "gfx90a", "block": [256, 1, 1], "grid": [4096, 1, 1], "globals": {}}}
    report = {"driver_version": 0, "kernels": [{"name": AXPY, "variants": [variant(8), variant(9)],
                                                "tracker": {"stopped_folding": ["1"]}}]}
    (tmp_path / "run.json").write_text(json.dumps(report))
    proc = run_cli("prewarm", str(kstore), "--from", str(tmp_path / "run.json"), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    # one decision per record of the kernel (gfx90a and gfx940), one variant for the launch's processor
    assert "1 compiled, 2 tracker decisions" in proc.stderr, proc.stderr
    table = extract(hip_samples() / "loop_count")
    kernel = next(k for k in table.kernels if k.name == AXPY and k.arch == "gfx90a")
    args = (struct.pack("<i", 1 << 20), struct.pack("<i", 12345), struct.pack("<f", 0.5), bytes(8), bytes(8))
    launch = Launch(args, (4096, 1, 1), (256, 1, 1), "gfx90a", {}, frozenset({1, 3, 4}))  # any iters: a run-time value
    hit = specializer.specialize(table, kernel, launch, Config.from_env(), make_chain(True, str(tmp_path / "cache"), 64),
                                 may_compile=False)
    assert hit.source == "disk" and 1 not in hit.folded


def test_prewarm_compiles_the_variants_a_run_had_not_compiled_when_it_ended(tmp_path):
    _lld()
    kstore = store.write(extract(hip_samples() / "loop_count"), tmp_path / "loop_count.kstore")
    launch = {"args": {"1": (8).to_bytes(4, "little").hex(), "2": struct.pack("<f", 0.5).hex()},
              "unknown_dims": ["grid"], "arch": "gfx90a", "block": [256, 1, 1], "grid": [4096, 1, 1], "globals": {}}
    report = {"driver_version": 0, "kernels": [{"name": AXPY, "variants": [], "not_compiled": [launch]}]}
    (tmp_path / "run.json").write_text(json.dumps(report))
    proc = run_cli("prewarm", str(kstore), "--from", str(tmp_path / "run.json"), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "1 compiled" in proc.stderr
    assert sorted(decode(p.read_bytes()).kind for p in (tmp_path / "cache").rglob("*.pjc")) == ["codeobj", "run"]


@pytest.mark.parametrize("launch", [{"args": {"1": "08000000"}, "unknown_dims": 5, "arch": "gfx90a"},
                                    {"args": ["08000000"], "arch": "gfx90a"}, "not a launch"])
def test_prewarm_says_in_one_line_that_a_variant_is_malformed(tmp_path, launch):
    kstore = store.write(extract(hip_samples() / "loop_count"), tmp_path / "loop_count.kstore")
    report = {"kernels": [{"name": AXPY, "variants": [{"launch": launch}], "tracker": {"stopped_folding": ["1"]}}]}
    (tmp_path / "run.json").write_text(json.dumps(report))
    proc = run_cli("prewarm", str(kstore), "--from", str(tmp_path / "run.json"), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"a variant of {AXPY} is malformed" in proc.stderr


def test_the_samples_target_builds_the_hip_samples_too():
    recipe = (ROOT / "Makefile").read_text().split("\nsamples:", 1)[1].split("\n\n", 1)[0]
    assert "samples/build.py" in recipe and "samples/build_hip.py" in recipe


# ---------------------------------------------------------------- choosing a record, the cache


def test_best_record_matches_processors_exactly_and_sm_versions_by_order(table):
    hip = extract(hip_samples() / "loop_count")
    axpy = [k for k in hip.kernels if k.name == AXPY]
    assert best_record(axpy, "gfx90a").arch == "gfx90a"
    assert best_record(axpy, "gfx90a:sramecc+:xnack-").arch == "gfx90a"  # gcnArchName, features and all
    assert best_record(axpy, "gfx940").arch == "gfx940"
    assert best_record(axpy, "gfx942") is None  # another processor's code never runs here
    assert best_record(axpy, 90) is None
    cuda = [k for k in table("loop_count_multi_arch").kernels if k.name == AXPY]
    assert sorted(k.arch for k in cuda) == [80, 90]
    assert best_record(cuda, 90).arch == 90 and best_record(cuda, 86).arch == 80 and best_record(cuda, 70).arch == 80


def test_cache_entries_keep_a_processor_name():
    entry = Entry("k" * 64, "codeobj", "gfx90a", b"\x7fELF...", {"kernel": AXPY})
    back = decode(encode(entry), "k" * 64)
    assert (back.kind, back.arch, back.data) == ("codeobj", "gfx90a", b"\x7fELF...")
    assert decode(encode(Entry("k" * 64, "cubin", 90, b"x")), "k" * 64).arch == 90


def test_specializer_serves_a_code_object_from_its_disk_cache(tmp_path):
    _lld()
    from proteus_rewrite.cache import make_chain

    table = extract(hip_samples() / "loop_count")
    kernel = next(k for k in table.kernels if k.name == AXPY and k.arch == "gfx90a")
    args = tuple(p.size * b"\0" for p in kernel.params)
    args = (struct.pack("<i", 1 << 20), struct.pack("<i", 8), struct.pack("<f", 0.5), args[3], args[4])
    launch = Launch(args, (4096, 1, 1), (256, 1, 1), "gfx90a", {}, frozenset({3, 4}))
    first = specializer.specialize(table, kernel, launch, Config.from_env(), make_chain(True, str(tmp_path), 64))
    assert first.source == "compiled" and isinstance(first.image, codegen.CodeObject) and first.ptx is None
    assert {"ir", "optimize", "object", "link"} <= set(first.timings_ms)
    _is_code_object(first.image.data)
    # a new process: memory empty, disk warm; another grid is the same variant (grids are not folded on AMDGPU)
    other_grid = Launch(args, (7, 1, 1), (256, 1, 1), "gfx90a", {}, frozenset({3, 4}))
    second = specializer.specialize(table, kernel, other_grid, Config.from_env(), make_chain(True, str(tmp_path), 64))
    assert second.source == "disk" and second.key == first.key
    assert isinstance(second.image, codegen.CodeObject) and second.image.data == first.image.data
    other_block = Launch(args, (4096, 1, 1), (128, 1, 1), "gfx90a", {}, frozenset({3, 4}))
    assert specializer.specialize(table, kernel, other_block, Config.from_env(), None).key != first.key


# ---------------------------------------------------------------- the run-time half, as the shim calls it


@pytest.fixture
def hip_runtime(tmp_path, monkeypatch):
    """runtime.init over a directory holding the loop_count HIP app's store, and that app's
    .hip_fatbin bytes in memory, as __hipRegisterFatBinary would find them."""
    _lld()
    app = hip_samples() / "loop_count"
    store.write(extract(app), tmp_path / "loop_count.kstore")
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PROTEUS_STORE_DIR", raising=False)
    monkeypatch.delenv("PROTEUS_DISABLE", raising=False)
    runtime.init(str(tmp_path), 0)
    section = hostelf.parse(app.read_bytes()).sections[".hip_fatbin"].data
    (bundle,) = offload_bundle.parse_section(section)
    buf = ctypes.create_string_buffer(section[: bundle.stored_size] + bytes(4096), bundle.stored_size + 4096)
    yield buf
    runtime.reset()


def _info(blob: bytes) -> tuple[int, int, int, int, list[int], bytes]:
    kid, nparams, dims, nglobals, _defer = struct.unpack_from("<5I", blob)
    sizes = list(struct.unpack_from(f"<{nparams}I", blob, 20))
    return kid, nparams, dims, nglobals, sizes, blob[20 + 4 * nparams : 20 + 5 * nparams]


def test_kernel_info_finds_a_registered_bundle_by_its_bytes(hip_runtime):
    blob = runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a:sramecc+:xnack-")
    kid, nparams, dims, nglobals, sizes, fold = _info(blob)
    assert (nparams, sizes, nglobals) == (5, [4, 4, 4, 8, 8], 0)
    assert fold == bytes([1, 1, 1, 0, 0])  # the scalars, never the pointers
    assert dims == 1  # the block (the launch bound), never the grid: AMDGPU folds no dimensions
    wrapper = struct.pack("<IIQQ", layouts.HIP_WRAPPER_MAGIC, 1, ctypes.addressof(hip_runtime), 0)
    wbuf = ctypes.create_string_buffer(wrapper, len(wrapper))
    assert runtime.kernel_info(ctypes.addressof(wbuf), AXPY, "gfx90a") is not None  # __hip_fatbin_wrapper too


def test_kernel_info_declines_other_processors_and_other_bundles(hip_runtime, capsys):
    assert runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx942") is None
    assert "has no bitcode for gfx942 (built for gfx90a, gfx940)" in capsys.readouterr().err
    other = ctypes.create_string_buffer(bytes(hip_runtime)[:64] + bytes(8192), 8192 + 64)
    struct.pack_into("<Q", other, 24, 0)  # a bundle with no entries: not the recorded one
    assert runtime.kernel_info(ctypes.addressof(other), AXPY, "gfx90a") is None
    assert "not in any kernel store" in capsys.readouterr().err


def test_specialize_returns_a_code_object_and_counts_it(hip_runtime, tmp_path, capsys):
    blob = runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a:sramecc+:xnack-")
    kid = _info(blob)[0]
    args = struct.pack("<iif", 1 << 20, 8, 0.5) + bytes(16)
    answer = runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a:sramecc+:xnack-")
    entry, image, variant, flags = protocol.split_image_answer(answer)
    assert variant == 1 and flags == 0  # HIP takes no GPU-time samples: no speed trial
    assert entry == AXPY  # HIP keeps the kernel's name: a code object is looked up by it
    _is_code_object(image)
    co = tmp_path / "v.co"
    co.write_bytes(image)
    assert _fmas(co) == 8
    again = protocol.split_image_answer(runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a"))
    assert again[:2] == (entry, image) and again[2] == 2  # from memory: the report's second entry
    runtime.load_failed(kid, 200)
    assert "hipModuleLoadData/hipModuleGetFunction failed with HIP error 200" in capsys.readouterr().err
    counters = protocol.COUNTERS.pack(kid, 3, 1, 0, 1, 0, 0, 0, 0, 0, 0) + AXPY.encode() + b"\0"
    runtime.write_report(str(tmp_path / "report.json"), counters, 0, (60_000_000, 90_500_000, 2, 0, 1_250_000, 1, 7_500_000, 3,
                                                                       500_000, 20_000_000, 1_000_000, 69_000_000, 0,
                                                                       250_000, 3_000_000, 2_000_000, 400, 700_250_000, 48_000_000,
                                                                       300_000_000, 0, 2, 10, 20, 750_000_020, 753_500_020,
                                                                       48_500_000, 3, 4_000_000, 9_000_000, 30_000_000,
                                                                       1_000_000, 0, 4_250_000, 250_000))
    doc = json.loads((tmp_path / "report.json").read_text())
    t = doc["threads_ms"]
    assert t.pop("report") >= 0
    assert t == {"app_main_wall": 750.0, "app_main_cpu": 700.25, "compile_threads_cpu": 48.0, "prestart_cpu": 300.0,
                 "after_main": 3.5}
    assert doc["timeline_ns"] == {"shim_loaded": 10, "main_start": 20, "main_end": 750_000_020, "report": 753_500_020}
    assert doc["shim_wait_ms"] == {"python_start": 60.0, "misses": 90.5, "miss_count": 2, "prepare_compiler": 0.0, "exit": 1.25,
                                   "compiling": 7.5, "compiling_count": 3,
                                   "miss_stages": {"lock": 0.5, "resolve": 20.0, "track": 1.0, "specialize": 69.0, "queue": 0.0,
                                                  "gil": 0.25, "load": 3.0},
                                   "compiling_checks": 2.0, "compiling_check_count": 400, "deferred_count": 0,
                                   "checks": {"ms": 48.5, "count": 3,
                                              "phases": {"prepare": 4.0, "shadow": 9.0, "app": 30.0, "compare": 1.0,
                                                         "readback": 0.0, "python": 4.25, "free": 0.25}}}
    assert doc["async_compilation"] == "auto"
    assert doc["prestart"] == {"python": True, "compiler": False, "variants_loaded": 2, "compiler_skipped": False}
    (k,) = doc["kernels"]
    assert (k["specializations"], k["memory_cache_hits"]) == (1, 1)
    assert k["variants"][0]["launch"]["arch"] == "gfx90a"
    assert list(k["failures"]) == ["hipModuleLoadData/hipModuleGetFunction failed with HIP error 200"]


def test_a_cache_only_request_says_when_a_variant_needs_compiling(hip_runtime, tmp_path):
    """What the shim asks on the launching thread before it queues a variant for a compile
    thread (PROTEUS_ASYNC_COMPILATION auto or 1): b"" for a variant no cache holds, the image
    otherwise. Until it compiles, the report lists the launch as not compiled, for prewarm."""
    kid = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))[0]
    args = struct.pack("<iif", 1 << 20, 8, 0.5) + bytes(16)
    assert runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1) == b""
    stats = runtime.state().stats[kid]
    assert (stats.specializations, stats.budget_refusals, stats.variants, stats.failures) == (0, 0, [], {})
    (queued,) = stats.queued.values()
    assert queued["args"] == {"0": struct.pack("<i", 1 << 20).hex(), "1": struct.pack("<i", 8).hex(),
                              "2": struct.pack("<f", 0.5).hex()} and queued["block"] == [256, 1, 1]
    counters = protocol.COUNTERS.pack(kid, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0) + AXPY.encode() + b"\0"
    runtime.write_report(str(tmp_path / "early.json"), counters)
    (k,) = json.loads((tmp_path / "early.json").read_text())["kernels"]
    assert k["not_compiled"] == [queued] and k["launches_while_compiling"] == 1
    image = runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a")  # what the compile thread does
    assert stats.queued == {} and stats.variants[0]["launch"] == queued
    assert protocol.split_image_answer(runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1))[:2] == \
        protocol.split_image_answer(image)[:2]
    assert (stats.specializations, stats.memory_hits) == (1, 1)
    # a spent compile budget is still a refusal (None: run the original), not a request to compile
    runtime.state().config = dataclasses.replace(runtime.state().config, compile_budget=1e-9, compile_grace_ms=0.0)
    other = struct.pack("<iif", 1 << 20, 9, 0.5) + bytes(16)
    assert runtime.specialize(kid, other, (4096, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1) is None
    assert stats.budget_refusals == 1
    # another compile thread's compilation of this kernel, 5 s along, counts before it is charged
    runtime.state().config = dataclasses.replace(runtime.state().config, compile_grace_ms=stats.compile_ms + 2000.0)
    stats.compiling[object()] = time.perf_counter() - 5.0
    assert runtime.specialize(kid, other, (4096, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1) is None
    assert stats.budget_refusals == 2
    stats.compiling.clear()
    assert runtime.specialize(kid, other, (4096, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1) == b""


def _miss(answer: bytes) -> tuple[int, bytes, bytes]:
    status, _, npol = protocol.MISS_HEADER.unpack_from(answer)
    off = protocol.MISS_HEADER.size
    return status, answer[off : off + npol], answer[off + npol :]


def test_one_miss_call_tracks_then_asks_the_caches_unless_the_policy_changed(hip_runtime, tmp_path):
    """runtime.miss, the shim's one call per miss: the tracker's policy, then specialize's
    answer; on the launch that makes the tracker stop folding a slot, the policy alone (the
    shim's key for that launch is stale), and nothing queued for it."""
    kid, nparams, *_ = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))
    stats = runtime.state().stats[kid]

    def launch(i: int) -> bytes:
        return struct.pack("<iif", 4096, i, 0.5) + bytes(16)

    status, policy, image = _miss(runtime.miss(kid, launch(0), (16, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1))
    assert (status, image) == (protocol.MISS_IMAGE, b"")  # no cache holds it: the shim queues it
    assert policy == runtime.track(kid, launch(0), (16, 1, 1), (256, 1, 1)) and policy[4:7] == b"\x01\x01\x01"
    assert len(stats.queued) == 1
    answers = [_miss(runtime.miss(kid, launch(i), (16, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1)) for i in range(1, 20)]
    changed = [i for i, (status, _, _) in enumerate(answers, 1) if status == protocol.MISS_POLICY_CHANGED]
    assert len(changed) == 1  # argument 1 stops being folded once
    status, policy, image = answers[changed[0] - 1]
    assert policy[4:7] == b"\x01\x00\x01" and image == b""
    assert len(stats.queued) == changed[0] + 1  # one per launch before it, none for it, one general variant after
    assert all(status == protocol.MISS_IMAGE for status, _, _ in answers[changed[0]:])
    # compiled (the compile thread's specialize), the general variant answers every later value
    image = runtime.specialize(kid, launch(99), (16, 1, 1), (256, 1, 1), b"", "gfx90a")
    status, got_policy, got = _miss(runtime.miss(kid, launch(1234), (16, 1, 1), (256, 1, 1), b"", "gfx90a", 0.0, 1))
    assert (status, got_policy, protocol.split_image_answer(got)[:2]) == \
        (protocol.MISS_IMAGE, policy, protocol.split_image_answer(image)[:2])
    # the tracker's decision was saved by that compilation, off the launching thread
    saved = [describe(p)["kind"] for p, _ in StorageCache(tmp_path / "cache").entries()]
    assert "policy" in saved and not stats.policy_unsaved


def test_launches_the_shim_deferred_reach_the_tracker_first_and_in_order(hip_runtime, tmp_path):
    """While a variant of a kernel is queued, the shim keeps launches with a new key for the
    tracker (defer(): up to kernel_info's `defer`, T + 2) and passes them with the kernel's next
    miss, or at exit (track_deferred): the tracker sees them first, in order, as if each had
    been a miss of its own; none of them is queued."""
    blob = runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a")
    kid = _info(blob)[0]
    assert struct.unpack_from("<5I", blob)[4] == 8 + 2  # T + 2, the defaults
    stats = runtime.state().stats[kid]
    grid, block = (16, 1, 1), (256, 1, 1)

    def launch(i: int) -> bytes:
        return struct.pack("<iif", 4096, i, 0.5) + bytes(16)

    def deferred(values) -> bytes:
        return b"".join(protocol.DEFERRED.pack(*grid, *block) + launch(i) for i in values)

    assert _miss(runtime.miss(kid, launch(0), grid, block, b"", "gfx90a", 0.0, 1))[0] == protocol.MISS_IMAGE  # queued
    # 1..7 deferred: with 8, nine distinct values, not yet more than T
    status, policy, _ = _miss(runtime.miss(kid, launch(8), grid, block, b"", "gfx90a", 0.0, 1, deferred(range(1, 8))))
    assert (status, policy[4:7], stats.tracker.variants) == (protocol.MISS_IMAGE, b"\x01\x01\x01", 9)
    assert len(stats.queued) == 2  # launches 0 and 8, not the deferred ones
    # the tenth value, deferred, stops argument 1's folding: the miss that passes it has a stale key
    status, policy, image = _miss(runtime.miss(kid, launch(10), grid, block, b"", "gfx90a", 0.0, 1, deferred([9])))
    assert (status, policy[4:7], image) == (protocol.MISS_POLICY_CHANGED, b"\x01\x00\x01", b"")
    assert stats.tracker.dropped == ["1"] and stats.policy_unsaved
    # at exit, what no miss took: counted, the policy as it is
    before = stats.tracker.variants
    assert runtime.track_deferred(kid, deferred([11]) + protocol.DEFERRED.pack(*grid, 512, 1, 1) + launch(12)) == policy
    assert stats.tracker.variants == before + 1  # block 512 is new; 11 is not, argument 1 being a parameter now
    assert runtime.track_deferred(kid, b"") == policy


def test_stored_size_of_bundles_in_memory_agrees_with_the_parser():
    for app in ("loop_count", "loop_count_ccob", "two_tu"):
        data = hostelf.parse((hip_samples() / app).read_bytes()).sections[".hip_fatbin"].data
        for b in offload_bundle.parse_section(data):
            assert offload_bundle.stored_size(lambda off, n: data[b.offset + off : b.offset + off + n]) == b.stored_size


@pytest.mark.parametrize("method", [0, 1])
def test_stored_size_of_a_ccob_v1_stops_at_the_stream_end(method):
    from .test_hip_extraction import _bundle, _ccob

    raw = _bundle([("hipv4-amdgcn-amd-amdhsa--gfx90a", bytes(range(256)) * 40)])
    packed = _ccob(raw, 1, method)
    data = packed + b"\x55" * 3000  # whatever follows it in memory
    assert offload_bundle.stored_size(lambda off, n: data[off : off + n]) == len(packed) == offload_bundle.parse(data).stored_size


def test_an_injected_codeobj_fault_is_a_specialize_error(monkeypatch):
    from proteus_rewrite.errors import SpecializeError

    table = extract(hip_samples() / "loop_count")
    kernel = next(k for k in table.kernels if k.name == AXPY and k.arch == "gfx90a")
    launch = Launch(tuple(bytes(p.size) for p in kernel.params), (1, 1, 1), (64, 1, 1), "gfx90a", {}, frozenset({3, 4}))
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "codeobj")
    with pytest.raises(SpecializeError, match="injected fault: codeobj failed"):
        specializer.specialize(table, kernel, launch, Config.from_env(), None)


def test_a_second_device_of_another_processor_runs_the_original(hip_runtime, capsys):
    """The kernel was resolved on a gfx90a; a launch on a gfx940 in the same process must not get
    gfx90a code (HIP keys variants per device, the record is per kernel)."""
    kid = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))[0]
    args = struct.pack("<iif", 1 << 20, 8, 0.5) + bytes(16)
    assert runtime.specialize(kid, args, (1, 1, 1), (256, 1, 1), b"", "gfx940:sramecc+:xnack-") is None
    assert "recorded for gfx90a, this device is a gfx940" in capsys.readouterr().err


def test_what_the_tracker_learned_is_where_the_next_run_starts(hip_runtime, tmp_path):
    blob = runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a:sramecc+:xnack-")
    kid, nparams, dims, _, _, fold = _info(blob)
    assert fold[:3] == b"\x01\x01\x01"
    pointers = bytes(16)
    policy = b""
    for iters in range(20):  # argument 1 changes on every launch: the tracker stops folding it
        policy = runtime.track(kid, struct.pack("<iif", 4096, iters, 0.5) + pointers, (16, 1, 1), (256, 1, 1))
    assert policy[4:7] == b"\x01\x00\x01"
    # saved off the launching thread: by the next compilation, or at exit (finish)
    assert StorageCache(tmp_path / "cache").entries() == []
    runtime.finish()
    saved = [describe(p) for p, _ in StorageCache(tmp_path / "cache").entries()]
    assert [(e["kind"], e["kernel"]) for e in saved if e["kind"] == "policy"] == [("policy", runtime.state().stats[kid].demangled)]
    # a new process over the same cache: argument 1 is a run-time parameter from its first launch
    runtime.reset()
    runtime.init(str(tmp_path), 0)
    kid, _, _, _, _, fold = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a:sramecc+:xnack-"))
    assert fold[:3] == b"\x01\x00\x01"
    counters = protocol.COUNTERS.pack(kid, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) + AXPY.encode() + b"\0"
    runtime.write_report(str(tmp_path / "report.json"), counters)
    (k,) = json.loads((tmp_path / "report.json").read_text())["kernels"]
    assert k["tracker"]["learned_from_earlier_runs"] == ["1"] and k["tracker"]["folded_now"] == [0, 2]
    # other tracker settings learn anew
    runtime.reset()
    os.environ["PROTEUS_TRACKER_THRESHOLD"] = "3"
    try:
        runtime.init(str(tmp_path), 0)
        assert _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))[5][:3] == b"\x01\x01\x01"
    finally:
        del os.environ["PROTEUS_TRACKER_THRESHOLD"]


def test_the_compiler_is_warmed_up_ahead_unless_the_last_run_compiled_nothing(hip_runtime, tmp_path, monkeypatch):
    """runtime.prepare_compiler(0, ahead=1), as the shim's prestart thread calls it, and
    runtime.finish at exit, over four processes sharing a disk cache."""
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")  # warm-ups counted here (a compiler process's: test_process.py)
    warm_ups = []
    monkeypatch.setattr(specializer, "warm_up", lambda arch, *a, **k: warm_ups.append(arch) or 1.0)
    keys = []  # left cold, it still prepares what every cache key computes once
    monkeypatch.setattr(specializer, "prepare_keys", lambda *a, **k: keys.append(1))
    args = struct.pack("<iif", 1 << 20, 8, 0.5) + bytes(16)

    def process(args=args, **env):
        runtime.reset()
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        runtime.init(str(tmp_path), 0)
        ahead = runtime.prepare_compiler(0, 1)
        kid = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))[0]
        assert runtime.specialize(kid, args, (4096, 1, 1), (256, 1, 1), b"", "gfx90a")
        compiled = runtime.compiled_this_run()
        runtime.finish()
        counters = protocol.COUNTERS.pack(kid, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) + AXPY.encode() + b"\0"
        runtime.write_report(str(tmp_path / "r.json"), counters, 0, (0,) * len(protocol.WAIT_FIELDS))
        prestart = json.loads((tmp_path / "r.json").read_text())["prestart"]
        notes = [describe(p) for p, _ in StorageCache(tmp_path / "cache").entries()]
        return ahead, compiled, prestart["compiler_skipped"], sorted(e["kind"] for e in notes)

    # first run: nothing known, so warmed up; it compiled, which is what no note means: none written
    assert process() == (True, 1, False, ["codeobj"])
    # second: still nothing known; all from the disk cache, so it notes that
    assert process() == (True, 0, False, ["codeobj", "run"])
    # third: left cold, and compiling nothing it writes nothing
    assert process() == (False, 0, True, ["codeobj", "run"])
    assert warm_ups == [runtime.WARM_UP_ARCH] * 2
    # a wrong guess: a new value compiles (on a compile thread, which warms the compiler up
    # first), and the note says so; the next run warms up ahead again
    other = struct.pack("<iif", 1 << 20, 9, 0.5) + bytes(16)
    assert process(other) == (False, 1, True, ["codeobj", "codeobj", "run"])
    assert process() == (True, 0, False, ["codeobj", "codeobj", "run"])
    assert process() == (False, 0, True, ["codeobj", "codeobj", "run"])
    # the note's lookup and the tracker's of a saved policy are left out of the report's disk
    # counts (and upstream's cache-stats lines): the variant's hit is all there is
    disk = runtime.state().cache.stats()["disk"]
    assert (disk.hits, disk.misses) == (1, 0)
    # synchronous compilation would warm up on the app's thread: always ahead
    assert process(PROTEUS_ASYNC_COMPILATION="0")[:3] == (True, 0, False)
    assert warm_ups == [runtime.WARM_UP_ARCH] * 4 and len(keys) == 3


def test_prepare_keys_computes_what_a_cache_key_needs_without_a_compiler():
    """In a fresh process: the lookups are made (ptxas first; nvJitLink where no ptxas will
    do), and neither LLVM nor nvJitLink is loaded."""
    code = ("from proteus_rewrite.jit import Config, codegen, specializer\n"
            "specializer.prepare_keys(Config.from_env(), 13000)\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(codegen.ptxas_usable(13000), codegen.ptxas_usable.cache_info().currsize,\n"
            "      codegen.locate_nvjitlink.cache_info().currsize, 'libllvmlite' in maps, 'nvJitLink' in maps)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    ptxas, asked, located, llvm, nvjitlink = proc.stdout.split()
    assert asked == "1" and located == ("0" if ptxas == "True" else "1") and (llvm, nvjitlink) == ("False", "False"), proc.stdout


def test_upstream_trace_lines_go_to_stdout_and_ours_to_stderr(hip_runtime, tmp_path, monkeypatch, capfd):
    """PROTEUS_TRACE_OUTPUT as upstream reads it: its tokens print its lines (compat.py) on the C
    library's stdout, at the launch that compiles and at exit; this project's tokens, on stderr."""
    monkeypatch.setenv("PROTEUS_TRACE_OUTPUT", "specialization;kernel-trace;variants")
    monkeypatch.setenv("PROTEUS_ENABLE_TIMERS", "1")
    monkeypatch.setenv("PROTEUS_ENABLE_TIME_TRACE", "1")
    monkeypatch.setenv("PROTEUS_TIME_TRACE_FILE", str(tmp_path / "run.time-trace"))
    monkeypatch.setenv("PROTEUS_TIME_TRACE_GRAIN", "0")
    runtime.reset()
    runtime.init(str(tmp_path), 0)
    kid = _info(runtime.kernel_info(ctypes.addressof(hip_runtime), AXPY, "gfx90a"))[0]
    assert runtime.specialize(kid, struct.pack("<iif", 1 << 20, 8, 0.5) + bytes(16), (4096, 1, 1), (256, 1, 1), b"", "gfx90a")
    runtime.finish(protocol.COUNTERS.pack(kid, 5, 4, 0, 0, 0, 0, 0, 0, 0, 0) + AXPY.encode() + b"\0")
    out, err = capfd.readouterr()
    assert f"[KernelConfig] ID:{AXPY} CG:RTC SA:1 LB:1 SD:1 SDR:0 OL:3 CGL:3 TMT:-1 BPSM:0 \n" in out  # upstream's defaults
    assert f"[ArgSpec] Replaced Function {AXPY} ArgNo 1 with value i32 8" in out
    assert "axpy_loop(int, int, float, float const*, float*)  rank=0  specializations=1  launches=5" in out
    assert "axpy_loop(int, int, float, float const*, float*): variant" in err and "[ArgSpec]" not in err
    assert re.search(r"^\[proteus\] optimizeIR optlevel 3 codegenopt 3 \d+ ms$", out, re.M)  # PROTEUS_ENABLE_TIMERS
    doc = json.loads((tmp_path / "run.time-trace").read_text())  # PROTEUS_ENABLE_TIME_TRACE: Chrome's format
    assert any(e.get("ph") == "X" and e["name"].startswith("compiled axpy_loop") and e["dur"] > 0 for e in doc["traceEvents"])
