"""libproteus.so's HIP half, as far as it can be proven without an AMD GPU.

The declarations the shim makes instead of including HIP headers are compiled against ROCm's
own headers and compared with what clang emits. Then the real HIP sample apps run on a fake HIP
runtime (tests/shim/fake_hip.c, built here as libamdhip64.so.5 with ROCm 5.2's symbol versions and
its own headers' types): memory is host memory and kernels are only logged, never executed, so
these runs prove what the shim does with the runtime (registration, which kernel each launch
runs, which code object is loaded, falling back) and that the app's own flow is unchanged, but
nothing about running a JIT code object on a GPU (docs/user/hip.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from proteus_rewrite.fatbin import amdgpu_codeobj
from proteus_rewrite.inject import shim

from ..conftest import ROOT, run_cli
from ..support.hip_samples import hip_samples

HIP_HEADER = Path("/usr/include/hip/hip_runtime_api.h")
SHIM = ROOT / "shim"
OBJDUMP = shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")
CLANG = shutil.which("clang-19")
EM_AMDGPU = 224
AXPY, POLY, MIX = "_Z9axpy_loopiifPKfPf", "_Z9poly_evaliidbPKdS0_Pd", "_Z10mix_roundsyjxPy"
FAKE_VERSIONS = "hip_4.2 {\n  global: *;\n};\nhip_5.2 {\n  global: hipLaunchKernel_spt; hipMemcpy_spt;\n} hip_4.2;\n"


def _headers():
    if not HIP_HEADER.is_file():
        pytest.skip(f"needs ROCm's HIP headers ({HIP_HEADER}: apt-get install libamdhip64-dev; scripts/install-deps)")


def _cc(args, **kw):
    return subprocess.run(["cc", "-std=gnu11", *map(str, args)], capture_output=True, text=True, **kw)


# ---------------------------------------------------------------- the declarations


DECLARE = "#define X(ret, name, params) ret name params;\nPROTEUS_HIP_API(X)\n"
SIZES = r"""
#include <stdio.h>
#define P(what) printf("%s %zu\n", #what, (size_t)(what));
int main(void) {
  P(sizeof(hipError_t)) P(sizeof(dim3)) P(offsetof(dim3, y)) P(offsetof(dim3, z)) P(sizeof(hipStream_t))
  P(sizeof(hipModule_t)) P(sizeof(hipFunction_t)) P(sizeof(hipDeviceptr_t)) P(sizeof(hipJitOption))
  P(sizeof(void **)) P(HIP_GCN_ARCH_NAME_OFFSET_CHECK) P(HIP_STREAM_PER_THREAD_CHECK) P(HIP_INVALID_IMAGE_CHECK)
  P(HIP_SUCCESS_CHECK) P(HIP_NOT_READY_CHECK) P(HIP_CAPTURE_IMPLICIT_CHECK) P(sizeof(hipStreamCaptureStatus))
  return 0;
}
"""


def _sizes(tmp_path, name, prelude) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(prelude + SIZES)
    exe = tmp_path / name
    proc = _cc(["-D__HIP_PLATFORM_AMD__", "-Werror", "-Wall", "-I", SHIM, src, "-o", exe])
    assert proc.returncode == 0, proc.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_the_shims_hip_declarations_match_rocms_headers(tmp_path):
    _headers()
    # Every function of PROTEUS_HIP_API redeclared with ROCm's types: a difference is an error.
    real = ("#define PROTEUS_HIP_REAL_TYPES\n#include <hip/hip_runtime_api.h>\n#include <stddef.h>\n"
            '#include "hip_api.h"\n' + DECLARE)
    src = tmp_path / "real.c"
    src.write_text(real)
    proc = _cc(["-D__HIP_PLATFORM_AMD__", "-Werror", "-Wall", "-I", SHIM, "-c", src, "-o", tmp_path / "real.o"])
    assert proc.returncode == 0, proc.stderr
    # ... and the check has teeth: one parameter off (size_t -> unsigned) fails to compile.
    src.write_text(real + "hipError_t hipLaunchKernel(const void *, dim3, dim3, void **, unsigned, hipStream_t);\n")
    proc = _cc(["-D__HIP_PLATFORM_AMD__", "-I", SHIM, "-c", src, "-o", tmp_path / "bad.o"])
    assert proc.returncode != 0 and "conflicting types for 'hipLaunchKernel'" in proc.stderr.replace("‘", "'").replace("’", "'")
    # The shim's own types have the sizes and layouts of ROCm's, and its constants their values.
    ours = _sizes(tmp_path, "ours", '#include "shim.h"\n#include "hip_api.h"\n'
                  "#define HIP_GCN_ARCH_NAME_OFFSET_CHECK HIP_GCN_ARCH_NAME_OFFSET\n"
                  "#define HIP_STREAM_PER_THREAD_CHECK (size_t)HIP_STREAM_PER_THREAD\n"
                  "#define HIP_INVALID_IMAGE_CHECK HIP_ERROR_INVALID_IMAGE\n#define HIP_SUCCESS_CHECK HIP_SUCCESS\n"
                  "#define HIP_NOT_READY_CHECK HIP_ERROR_NOT_READY\n"
                  "#define HIP_CAPTURE_IMPLICIT_CHECK HIP_ERROR_STREAM_CAPTURE_IMPLICIT\n")
    rocm = _sizes(tmp_path, "rocm", "#include <hip/hip_runtime_api.h>\n#include <stddef.h>\n"
                  "#define HIP_GCN_ARCH_NAME_OFFSET_CHECK offsetof(hipDeviceProp_t, gcnArchName)\n"
                  "#define HIP_STREAM_PER_THREAD_CHECK (size_t)hipStreamPerThread\n"
                  "#define HIP_INVALID_IMAGE_CHECK hipErrorInvalidImage\n#define HIP_SUCCESS_CHECK hipSuccess\n"
                  "#define HIP_NOT_READY_CHECK hipErrorNotReady\n"
                  "#define HIP_CAPTURE_IMPLICIT_CHECK hipErrorStreamCaptureImplicit\n"
                  "typedef hipJitOption hipJitOption_;\n")
    assert ours == rocm, (ours, rocm)


def _declares(ir: str) -> dict[str, str]:
    """name -> 'ret(param types)' of every `declare` in LLVM IR, attributes and names dropped."""
    out = {}
    for m in re.finditer(r"^declare (?:[a-z_]+ )*?(\S+) @(\w+)\((.*?)\)", ir, re.M):
        ret, name, params = m.groups()
        types = [p.split()[0] for p in params.split(",") if p.strip()]
        out[name] = f"{ret}({', '.join(types)})"
    return out


def test_registration_declarations_match_what_clang_emits(tmp_path):
    """No header declares __hipRegister*: clang emits the calls. Both sides lowered to LLVM IR."""
    _headers()
    if not CLANG:
        pytest.skip("needs clang-19 (scripts/install-deps)")
    from samples import build_hip

    hip = tmp_path / "k.hip"
    hip.write_text("#include <hip/hip_runtime.h>\n__device__ float table[4];\n"
                   "__global__ void k(float *p, int n) { p[n] = table[n]; }\n")
    emitted = subprocess.run([CLANG.replace("clang-19", "clang++-19"), *build_hip.hip_flags("clang++-19"), "--cuda-host-only",
                              "--offload-arch=gfx90a", "-S", "-emit-llvm", "-o", "-", str(hip)],
                             capture_output=True, text=True)
    assert emitted.returncode == 0, emitted.stderr
    theirs = _declares(emitted.stdout)
    c = tmp_path / "ours.c"
    c.write_text('#include "shim.h"\n#include "hip_api.h"\n' + DECLARE +
                 "#define USE(ret, name, params) (void *)name,\nvoid *used[] = {PROTEUS_HIP_API(USE)};\n")
    ours_ir = subprocess.run([CLANG, "-O0", "-I", str(SHIM), "-S", "-emit-llvm", "-o", "-", str(c)],
                             capture_output=True, text=True)
    assert ours_ir.returncode == 0, ours_ir.stderr
    ours = _declares(ours_ir.stdout)
    names = ["__hipRegisterFatBinary", "__hipRegisterVar", "__hipUnregisterFatBinary", "hipLaunchKernel"]
    assert {n: theirs.get(n) for n in names} == {n: ours[n] for n in names}
    # clang declares __hipRegisterFunction as returning int (as it does __cudaRegisterFunction) and
    # never uses the result; ROCm defines it void, and so does the shim. The parameters must agree.
    assert ours["__hipRegisterFunction"] == "void(ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr)"
    assert theirs["__hipRegisterFunction"] in ("i32(ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr)",
                                                ours["__hipRegisterFunction"])
    for result in re.findall(r"(%\w+) = call \w+ @__hipRegisterFunction\(", emitted.stdout):
        assert len(re.findall(re.escape(result) + r"\b", emitted.stdout)) == 1  # defined, never read


def test_the_shim_includes_no_hip_header():
    for path in [*SHIM.glob("*.c"), *SHIM.glob("*.h")]:
        assert not re.search(r"#\s*include\s*[<\"]hip/", path.read_text()), path


# ---------------------------------------------------------------- C unit tests


def test_hip_shim_unit_tests(tmp_path):
    exe = tmp_path / "test_hip_shim"
    from proteus_rewrite.inject import shim as shim_mod

    proc = _cc(["-O1", "-Wall", "-I", SHIM, Path(__file__).parent / "test_hip_shim.c", *[SHIM / n for n in shim_mod.SOURCES], "-o", exe,
                "-ldl", "-lpthread"])
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "all passed" in run.stdout


# ---------------------------------------------------------------- the sample apps on a fake runtime


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    """A directory holding the fake libamdhip64.so.5."""
    _headers()
    d = tmp_path_factory.mktemp("fakehip")
    (d / "hip.map").write_text(FAKE_VERSIONS)
    proc = _cc(["-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__",
                "-Wl,-soname,libamdhip64.so.5", f"-Wl,--version-script={d / 'hip.map'}", Path(__file__).parent / "fake_hip.c",
                "-o", d / "libamdhip64.so.5", "-lpthread"])
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.fixture(scope="module")
def libproteus(tmp_path_factory) -> Path:
    return shim.build(tmp_path_factory.mktemp("shim") / "libproteus.so")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, libproteus):
    """recorded(app) -> the directory `proteus-rewrite APP -o DIR` wrote, with this tree's shim."""
    dirs = {}

    def get(app: str) -> Path:
        if app not in dirs:
            d = tmp_path_factory.mktemp(app)
            proc = run_cli(str(hip_samples() / app), "-o", str(d))
            assert proc.returncode == 0, proc.stderr
            shutil.copy(libproteus, d / "libproteus.so")  # the one just built from shim/, not the installed one
            dirs[app] = d
        return dirs[app]

    return get


class Run:
    def __init__(self, proc, log: Path, report: Path, cos: Path):
        self.proc, self.stdout, self.stderr = proc, proc.stdout, proc.stderr
        self.log = log.read_text().splitlines() if log.exists() else []
        self.report = json.loads(report.read_text()) if report.exists() else None
        self.cos = cos

    def lines(self, what: str) -> list[list[str]]:
        return [line.split() for line in self.log if line.split()[0] == what]

    def kernel(self, name: str) -> dict:
        return next(k for k in self.report["kernels"] if k["name"] == name)

    def code_object(self, module: str) -> bytes:
        return (self.cos / f"module-{module}.co").read_bytes()


def run_app(exe: Path, fake: Path, tmp: Path, shim_dir: Path | None = None, tag: str = "run", cache: Path | None = None,
            **env) -> Run:
    """The app on the fake runtime. Compiled on the launching thread (PROTEUS_ASYNC_COMPILATION=0)
    unless env says otherwise, so that which launch runs what is exact; None unsets a variable
    (PROTEUS_ASYNC_COMPILATION=None: the default, auto)."""
    work = tmp / tag
    work.mkdir()
    cos = work / "cos"
    cos.mkdir()
    env = {"PROTEUS_ASYNC_COMPILATION": "0", **env}
    full = dict(os.environ, LD_LIBRARY_PATH=str(fake), FAKE_HIP_LOG=str(work / "fake.log"), FAKE_HIP_DIR=str(cos),
                PROTEUS_CACHE_DIR=str(cache or work / "cache"), PROTEUS_REPORT=str(work / "report.json"))
    full.update({k: v for k, v in env.items() if v is not None})
    for k in ("PROTEUS_DISABLE", "PROTEUS_FAULT_INJECT", "PROTEUS_STORE_DIR", "LD_PRELOAD", "FAKE_HIP_BUSY", *env):
        if env.get(k) is None:
            full.pop(k, None)
    if shim_dir is not None:
        full["LD_PRELOAD"] = str(shim_dir / "libproteus.so")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=full, timeout=300)
    return Run(proc, work / "fake.log", work / "report.json", cos)


def _fmas(co: bytes, tmp: Path) -> list[str]:
    if not OBJDUMP:
        pytest.skip("needs llvm-objdump (apt-get install llvm-19)")
    path = tmp / "jit.co"
    path.write_bytes(co)
    asm = subprocess.run([OBJDUMP, "-d", "--mcpu=gfx90a", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"v_fmac?_f32\S*\s+v\d+, (\S+),", asm)


def _is_code_object(co: bytes, kernel: str) -> None:
    assert co[:4] == b"\x7fELF" and struct.unpack_from("<H", co, 18)[0] == EM_AMDGPU
    parsed = amdgpu_codeobj.parse(co)
    assert parsed.arch == "gfx90a"
    assert f"{kernel}.kd" in parsed.descriptors


@pytest.fixture(scope="module")
def native(fake, tmp_path_factory):
    """native(app) -> the app's run on the fake runtime without the shim."""
    runs = {}

    def get(app: str) -> Run:
        if app not in runs:
            r = run_app(hip_samples() / app, fake, tmp_path_factory.mktemp(f"native-{app}"))
            assert r.proc.returncode == 0, r.stderr
            assert r.lines("launch") or r.lines("launch_spt") or r.lines("module_launch")
            runs[app] = r
        return runs[app]

    return get


def test_loop_count_specializes_every_kernel_and_loads_its_code_objects(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"))
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout and "warning" not in r.stderr
    # registration was seen, and no kernel was launched the original way
    assert [line[2] for line in r.lines("register_function")] == [AXPY, POLY, MIX]
    assert r.lines("launch") == []
    loads = r.lines("module_load")
    assert len(loads) == 4  # axpy_loop twice (8 and 3 iterations), poly_eval, mix_rounds
    launches = [(line[1], line[2], line[3], line[4], line[5]) for line in r.lines("module_launch")]
    assert launches == [
        ("0", AXPY, "4096,1,1", "256,1,1", "00000008"),  # one load serves the three identical launches
        ("0", AXPY, "4096,1,1", "256,1,1", "00000008"),
        ("0", AXPY, "4096,1,1", "256,1,1", "00000008"),
        ("1", AXPY, "8192,1,1", "128,1,1", "00000003"),  # a changed scalar (and block): a new variant
        ("2", POLY, "1024,1,1", "256,1,1", "0000000c"),
        ("3", MIX, "512,1,1", "512,1,1", "00000005"),
    ]
    # the code objects: AMDGPU ELF for gfx90a, the kernel and its descriptor, the loop folded
    for module, kernel in (("0", AXPY), ("1", AXPY), ("2", POLY), ("3", MIX)):
        _is_code_object(r.code_object(module), kernel)
    assert _fmas(r.code_object("0"), tmp_path) == ["0.5"] * 8  # 8 iterations of a = 0.5, unrolled
    assert len(_fmas(r.code_object("1"), tmp_path)) == 3  # 3 of a = -0.25 (0xbe800000)
    axpy = r.kernel(AXPY)
    assert (axpy["launches"], axpy["specialized_launches"], axpy["table_hits"], axpy["specializations"]) == (4, 4, 2, 2)
    assert [v["folded"] for v in axpy["variants"]] == [{"0": 1048576, "1": 8, "2": 0.5}, {"0": 1048576, "1": 3, "2": -0.25}]
    assert all(v["launch"]["arch"] == "gfx90a" for v in axpy["variants"])
    for name in (POLY, MIX):
        k = r.kernel(name)
        assert (k["launches"], k["specialized_launches"], k["specializations"], k["failures"]) == (1, 1, 1, {})
    assert r.report["unknown_handle_launches"] == 0
    waits = r.report["shim_wait_ms"]  # 4 misses: axpy twice, poly and mix once
    assert waits["miss_count"] == 4 and waits["python_start"] > 0 and waits["misses"] > 0 and waits["exit"] == 0
    # Python started on the prestart thread at registration; HIP has no compiler warm-up
    assert r.report["prestart"] == {"python": True, "compiler": False, "variants_loaded": 0, "compiler_skipped": False}


def test_a_miss_compiles_on_a_compile_thread_and_a_later_launch_gets_the_variant(fake, recorded, native, tmp_path):
    """The default (PROTEUS_ASYNC_COMPILATION=auto), through the core's miss path as on CUDA: a
    launch that misses queues its variant for a compile thread and runs the original; the next
    launch that asks for the same variant, its stream still busy (FAKE_HIP_BUSY=1), waits for it
    and runs it, and the one after that hits. A launch that asks for a variant first never waits:
    axpy's second key and the other kernels' single launches run the original, and their variants
    are compiled before exit."""
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), PROTEUS_ASYNC_COMPILATION=None,
                FAKE_HIP_BUSY="1")
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout and "warning" not in r.stderr
    # axpy's first launch (8 iterations) and each first launch of another key ran the original ...
    assert [(line[1], line[4]) for line in r.lines("launch")] == [(AXPY, "00000008"), (AXPY, "00000003"), (POLY, "0000000c"),
                                                                  (MIX, "00000005")]
    # ... the 2nd waited for the variant the 1st queued, and the 3rd hit it
    assert [(line[2], line[5]) for line in r.lines("module_launch")] == [(AXPY, "00000008")] * 2
    # every variant was compiled and loaded on a compile thread: the exit waited for those queued
    loads = r.lines("module_load")
    assert len(loads) == 4 and {line[-1] for line in loads} == {"other"}
    axpy = r.kernel(AXPY)
    assert (axpy["launches"], axpy["specialized_launches"], axpy["launches_while_compiling"], axpy["specializations"]) == (4, 2, 2, 2)
    for name in (POLY, MIX):
        k = r.kernel(name)
        assert (k["launches"], k["specialized_launches"], k["launches_while_compiling"], k["specializations"]) == (1, 0, 1, 1)
    waits = r.report["shim_wait_ms"]
    assert waits["compiling_count"] == 1 and waits["compiling"] > 0  # the one wait, on the compile thread's variant
    assert r.report["unknown_handle_launches"] == 0


def test_upstreams_asynchronous_mode_never_waits_and_the_next_run_is_served_from_the_cache(fake, recorded, native, tmp_path):
    """PROTEUS_ASYNC_COMPILATION=1: every miss queues, every launch runs the original while its
    variant compiles, busy stream or not; the compile threads finish the queue before exit, so the
    next run's launches are served from the disk cache, loaded on the launching thread."""
    cache = tmp_path / "cache"
    cold = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "cold", cache,
                   PROTEUS_ASYNC_COMPILATION="1", FAKE_HIP_BUSY="1")
    assert cold.proc.returncode == 0, cold.stderr
    assert cold.stdout == native("loop_count").stdout and "warning" not in cold.stderr
    assert cold.report["shim_wait_ms"]["compiling_count"] == 0
    assert {line[-1] for line in cold.lines("module_load")} == {"other"} and len(cold.lines("module_load")) == 4
    assert sum(k["specializations"] for k in cold.report["kernels"]) == 4
    assert sum(k["launches_while_compiling"] for k in cold.report["kernels"]) >= 4  # each key's first launch at least
    warm = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "warm", cache,
                   PROTEUS_ASYNC_COMPILATION="1")
    assert warm.proc.returncode == 0 and warm.stdout == native("loop_count").stdout, warm.stderr
    assert warm.lines("launch") == [] and len(warm.lines("module_launch")) == 6
    assert {line[-1] for line in warm.lines("module_load")} == {"main"}
    assert sum(k["disk_cache_hits"] for k in warm.report["kernels"]) == 4


def test_a_second_run_loads_its_variants_from_the_disk_cache(fake, recorded, native, tmp_path):
    cache = tmp_path / "cache"
    first = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "first", cache)
    second = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "second", cache)
    assert second.proc.returncode == 0 and second.stdout == native("loop_count").stdout
    assert sum(k["specializations"] for k in first.report["kernels"]) == 4
    assert sum(k["specializations"] for k in second.report["kernels"]) == 0
    assert sum(k["disk_cache_hits"] for k in second.report["kernels"]) == 4
    assert len(second.lines("module_load")) == 4 and second.lines("launch") == []
    assert second.code_object("0") == first.code_object("0")


def test_a_refused_code_object_runs_the_original_kernel(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), FAKE_HIP_FAIL="load")
    # the app checks hipGetLastError after every launch: the shim must not leave its load error behind
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout
    assert r.lines("module_launch") == [] and len(r.lines("module_load_failed")) == 4
    assert [line[1:] for line in r.lines("launch")] == [line[1:] for line in native("loop_count").lines("launch")]
    axpy = r.kernel(AXPY)
    assert axpy["specialized_launches"] == 0 and axpy["fallback_launches"] == 4
    assert list(axpy["failures"]) == ["hipModuleLoadData/hipModuleGetFunction failed with HIP error 200"]
    assert r.stderr.count("warning") == 3  # one per kernel


def test_a_failed_specialized_launch_runs_the_original_kernel(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), FAKE_HIP_FAIL="launch")
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout
    assert len(r.lines("module_launch_failed")) == 6
    assert [line[1:] for line in r.lines("launch")] == [line[1:] for line in native("loop_count").lines("launch")]
    axpy = r.kernel(AXPY)
    assert (axpy["launch_errors"], axpy["specialized_launches"]) == (4, 0)


def test_an_injected_load_fault_runs_the_original_kernel(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), PROTEUS_FAULT_INJECT="module-load")
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout
    assert r.lines("module_load") == [] and len(r.lines("launch")) == 6


def test_without_prestart_the_first_launch_starts_python(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), PROTEUS_PRESTART="0")
    assert r.proc.returncode == 0 and r.stdout == native("loop_count").stdout, r.stderr
    assert r.report["prestart"] == {"python": False, "compiler": False, "variants_loaded": 0, "compiler_skipped": False}
    assert r.report["shim_wait_ms"]["python_start"] > 0 and len(r.lines("module_load")) == 4
    t, th = r.report["timeline_ns"], r.report["threads_ms"]
    assert 0 < t["shim_loaded"] <= t["main_start"] < t["main_end"] <= t["report"], t
    assert abs((t["main_end"] - t["main_start"]) / 1e6 - th["app_main_wall"]) < 0.01 and 0 < th["app_main_cpu"], th


def test_disabled_means_pass_through(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), PROTEUS_DISABLE="1")
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout and r.stderr == ""
    assert r.log == native("loop_count").log  # not even the device's properties were asked for
    assert r.report["python"] is False and r.report["disabled"] is True
    t = r.report["timeline_ns"]  # the shim wraps main even so: a benchmark places the run's phases
    assert 0 < t["shim_loaded"] <= t["main_start"] < t["main_end"] <= t["report"], t


@pytest.mark.parametrize("setting", [{"PROTEUS_ASYNC_COMPILATION": "maybe"}, {"PROTEUS_OPT_LEVEL": "9"}])
def test_a_bad_setting_is_one_line_and_the_app_runs_as_built(fake, recorded, native, tmp_path, setting):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), **setting)
    assert r.proc.returncode == 0 and r.stdout == native("loop_count").stdout
    (name, value), = setting.items()
    assert r.stderr.splitlines() == [f"proteus: error: {name}={value!r}: expected "
                                     f"{'0, 1 or auto' if 'ASYNC' in name else 'one of 0, 1, 2, 3, s, z'}; kernels run unspecialized"]
    assert r.lines("module_load") == [] and len(r.lines("launch")) == 6


def test_a_device_the_app_was_not_built_for_runs_the_original_kernels(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), FAKE_HIP_ARCH="gfx942:sramecc+:xnack-")
    assert r.proc.returncode == 0 and r.stdout == native("loop_count").stdout
    assert r.lines("module_load") == [] and len(r.lines("launch")) == 6
    assert "has no bitcode for gfx942" in r.stderr
    unknown = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "noarch", FAKE_HIP_ARCH="")
    assert unknown.proc.returncode == 0 and unknown.stdout == native("loop_count").stdout
    assert "cannot tell the processor of HIP device 0" in unknown.stderr and len(unknown.lines("launch")) == 6


@pytest.mark.parametrize("app", ["templates", "two_tu", "device_globals", "loop_count_ccob", "loop_count_cov4",
                                 "loop_count_driver", "loop_count_spt"])
def test_every_sample_runs_its_kernels_specialized(fake, recorded, native, tmp_path, app):
    r = run_app(hip_samples() / app, fake, tmp_path, recorded(app))
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native(app).stdout
    assert r.lines("launch") == [] and r.lines("launch_spt") == [], r.stderr  # every launch ran a JIT kernel
    originals = native(app).lines("launch_spt" if app == "loop_count_spt" else "launch")
    assert len(r.lines("module_launch")) == len(originals) > 0
    if app == "loop_count_spt":  # <<<>>> on the per-thread default stream: the JIT launch keeps to it
        assert {line[-1] for line in r.lines("module_launch")} == {"0x2"}
    assert len(r.lines("register_fatbin")) == len(native(app).lines("register_fatbin"))
    for k in r.report["kernels"]:
        assert k["specialized_launches"] == k["launches"] > 0 and k["failures"] == {}, k
    for line in r.lines("module_load"):
        co = r.code_object(line[1])
        assert co[:4] == b"\x7fELF" and struct.unpack_from("<H", co, 18)[0] == EM_AMDGPU
    if app == "device_globals":  # the JIT code reaches the AOT variables at hipGetSymbolAddress's addresses
        for k in r.report["kernels"]:
            assert sorted(k["globals"]) == ["coeffs", "hits", "table"]
            assert all(a > 0 for v in k["variants"] for a in v["launch"]["globals"].values())


def test_the_module_api_app_runs_the_jit_kernel(fake, recorded, native, tmp_path):
    r = run_app(hip_samples() / "module_api", fake, tmp_path, recorded("module_api"))
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("module_api").stdout
    # module 0 is the app's own bundle; module 1 the JIT code object, which runs the three launches
    assert [line[1] for line in r.lines("module_load")] == ["0", "1"]
    assert [line[1:3] for line in r.lines("module_launch")] == [["1", "scale_loop"]] * 3
    _is_code_object(r.code_object("1"), "scale_loop")
    k = r.kernel("scale_loop")
    assert (k["launches"], k["specialized_launches"], k["table_hits"], k["specializations"]) == (3, 3, 2, 1)
    assert k["variants"][0]["folded"] == {"1": 1048576, "2": 10, "3": 0.75}
    assert k["variants"][0]["launch"]["globals"]["bias"] > 0  # hipModuleGetGlobal's address


def test_the_rewritten_executable_specializes_without_preload(fake, recorded, native, tmp_path):
    exe = recorded("loop_count") / "loop_count"
    r = run_app(exe, fake, tmp_path)
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout
    assert r.lines("launch") == [] and len(r.lines("module_launch")) == 6


def test_a_cuda_process_loads_nothing_of_hip(libproteus, samples, tmp_path):
    """The HIP entry points are only looked up once a HIP app calls one."""
    env = dict(os.environ, LD_PRELOAD=str(libproteus), LD_DEBUG="files", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    subprocess.run([str(samples / "loop_count")], capture_output=True, text=True, env=env, timeout=120)
    py = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], capture_output=True, text=True,
                        env=dict(os.environ, LD_PRELOAD=str(libproteus)))
    traces = "".join(p.read_text() for p in tmp_path.glob("ld*"))
    assert "libproteus.so" in traces  # the trace is real
    assert "amdhip" not in traces and "amdhip" not in py.stdout


def _variant_keys(shared: Path) -> list[str]:
    """The keys of the code objects in a shared tier (not the run's notes, also entries there)."""
    from proteus_rewrite.cache import decode

    return sorted(p.name[: -len(".pjc")] for p in (shared / "entries").rglob("*.pjc")
                  if decode(p.read_bytes(), p.name[: -len(".pjc")]).kind == "codeobj")


@pytest.mark.parametrize("holder", ["stops renewing", "publishes"])
def test_a_claim_held_on_another_node_inside_the_shims_compile_thread(fake, recorded, native, tmp_path, monkeypatch,
                                                                      holder):
    """The shared tier's claims (#52) through the real shim, defaults (compile threads): another
    node holds the claim of every variant the run will ask for. The launches that miss run the
    original kernel; the compile thread waits for the holder. Where the holder stops renewing, the
    compile thread breaks its claim once the lease is over and compiles the variant itself; where
    the holder publishes, the compile thread takes its entry and compiles nothing. Either way the
    app's output is native and each variant is in the shared tier once."""
    from proteus_rewrite.file_tier import SharedFileTier

    learn = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "learn",
                    PROTEUS_ASYNC_COMPILATION=None, PROTEUS_CACHE_SHARED=f"file://{tmp_path / 'learned'}")
    assert learn.proc.returncode == 0, learn.stderr
    keys = _variant_keys(tmp_path / "learned")
    assert len(keys) == 4  # axpy twice, poly, mix
    learned = SharedFileTier(tmp_path / "learned")
    entries = {k: learned.get(k) for k in keys}

    monkeypatch.setattr(socket, "gethostname", lambda: "another-node")
    shared = tmp_path / "shared"
    elsewhere = SharedFileTier(shared, lease_s=1.0)
    claims = [elsewhere.claim(k) for k in keys]
    assert all(claims)
    publisher = None
    if holder == "publishes":
        def publish():  # once a launch has run the original: its miss found the claim held
            log = tmp_path / "run" / "fake.log"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (log.exists() and "\nlaunch " in "\n" + log.read_text()):
                time.sleep(0.05)
            for k in keys:
                elsewhere.put(entries[k])
                elsewhere.release(claims[keys.index(k)])
        publisher = threading.Thread(target=publish)
        publisher.start()
    r = run_app(hip_samples() / "loop_count", fake, tmp_path, recorded("loop_count"), "run",
                PROTEUS_ASYNC_COMPILATION=None, PROTEUS_CACHE_SHARED=f"file://{shared}", PROTEUS_CACHE_LEASE_S="1")
    if publisher is not None:
        publisher.join()
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == native("loop_count").stdout and "warning" not in r.stderr
    claimed = r.report["claims"]
    compiled = sum(k["specializations"] for k in r.report["kernels"])
    if holder == "stops renewing":
        # each compilation found the claim held and broke it after the lease. (A job the tracker
        # made stale while it waited is dropped unread: axpy's second key may be, so the count
        # is the compilations', not 4.)
        assert compiled >= 3 and claimed["broken"] == compiled and claimed["lost"] >= compiled
        assert len(_variant_keys(shared)) == compiled and set(_variant_keys(shared)) <= set(keys)
    else:  # ... and the compile thread took what the holder published
        assert compiled == 0 and claimed["shared_hits"] >= 1
        assert _variant_keys(shared) == keys
