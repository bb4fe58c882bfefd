"""libproteus.so on the CPU: it builds, its hot-path pieces work, and it is harmless in
programs that do not use CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proteus_rewrite.inject import shim

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def libproteus(tmp_path_factory) -> Path:
    return shim.build(tmp_path_factory.mktemp("shim") / "libproteus.so")


def test_hash_table_and_key_unit_tests(tmp_path):
    exe = tmp_path / "test_shim"
    srcs = [str(ROOT / "shim" / n) for n in shim.SOURCES if n != "hip.c"]
    subprocess.run(["cc", "-std=gnu11", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(Path(__file__).parent / "test_shim.c"), *srcs,
                    "-o", str(exe), "-ldl", "-lpthread"], check=True, capture_output=True)
    fatbins = tmp_path / "libfake_fatbins.so"
    subprocess.run(["cc", "-std=gnu11", "-shared", "-fPIC", "-I", str(ROOT / "shim"), str(Path(__file__).parent / "fake_fatbins.c"),
                    "-o", str(fatbins)], check=True, capture_output=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=dict(os.environ, PROTEUS_TEST_FATBINS=str(fatbins)))
    assert proc.returncode == 0, proc.stderr
    assert "all passed" in proc.stdout


def test_unit_tests_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The same unit tests built with ASan and UBSan: a use after free, an overflow or a
    misaligned read in the shim's core fails here rather than as a corrupt heap in an app.
    ASan's own start-up calls dlsym before the shim's globals exist, so the shim's dlsym
    wrapper is renamed in this build (leaks are not counted: the tables live until exit)."""
    exe = tmp_path / "test_shim"
    srcs = [str(ROOT / "shim" / n) for n in shim.SOURCES if n != "hip.c"]
    subprocess.run(["cc", "-std=gnu11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-fno-omit-frame-pointer", "-Ddlsym=shim_unit_test_dlsym", "-I", str(ROOT / "shim"),
                    str(Path(__file__).parent / "test_shim.c"), *srcs, "-o", str(exe), "-ldl", "-lpthread"],
                   check=True, capture_output=True)
    fatbins = tmp_path / "libfake_fatbins.so"
    subprocess.run(["cc", "-std=gnu11", "-shared", "-fPIC", "-I", str(ROOT / "shim"), str(Path(__file__).parent / "fake_fatbins.c"),
                    "-o", str(fatbins)], check=True, capture_output=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PROTEUS_TEST_FATBINS=str(fatbins), ASAN_OPTIONS="detect_leaks=0"))
    assert proc.returncode == 0 and "all passed" in proc.stdout, proc.stderr[-3000:]


def test_nvtx_ranges_reach_a_profiler(tmp_path):
    """The shim's NVTX ranges, as a profiler's injection library receives them: the unit tests'
    speed-trial turns, each push popped on its own thread (the GPU tests see misses, compilations
    and validation checks of real launches)."""
    exe = tmp_path / "test_shim"
    srcs = [str(ROOT / "shim" / n) for n in shim.SOURCES if n != "hip.c"]
    cc = ["cc", "-std=gnu11", "-O1", "-I", str(ROOT / "shim")]
    subprocess.run([*cc, str(Path(__file__).parent / "test_shim.c"), *srcs, "-o", str(exe), "-ldl", "-lpthread"],
                   check=True, capture_output=True)
    fatbins, inject = tmp_path / "libfake_fatbins.so", tmp_path / "libnvtx_log.so"
    subprocess.run([*cc, "-shared", "-fPIC", str(Path(__file__).parent / "fake_fatbins.c"), "-o", str(fatbins)], check=True)
    subprocess.run([*cc, "-shared", "-fPIC", str(ROOT / "tests" / "support" / "nvtx_log.c"), "-o", str(inject)], check=True)
    log = tmp_path / "nvtx.log"
    env = dict(os.environ, PROTEUS_TEST_FATBINS=str(fatbins), NVTX_INJECTION64_PATH=str(inject), NVTX_LOG=str(log))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    assert ["domain", "proteus-rewrite"] in [r[1:] for r in lines if r[1] == "domain"]
    pushed = [r[2] for r in lines if r[1] == "push"]
    assert any(p.startswith("proteus-rewrite speed trial: ") for p in pushed), pushed
    depth: dict[str, int] = {}
    for tid, what, *_ in lines:
        depth[tid] = depth.get(tid, 0) + (what == "push") - (what == "pop")
        assert depth[tid] >= 0, "a pop without its push"
    assert set(depth.values()) == {0}, depth


def test_exports_only_the_interposed_symbols(libproteus):
    out = subprocess.run(["nm", "-D", "--defined-only", str(libproteus)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert exported == {
        "dlsym", "__libc_start_main", "exit",  # main's return and exit() wait for the compiler's start-up
        "cuLaunchKernel", "cuLaunchKernelEx", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleGetFunction",
        "cuModuleUnload", "cuStreamBeginCapture_v2", "cuStreamEndCapture",
        "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphExecKernelNodeSetParams_v2",
        "cuGraphExecNodeSetParams", "cuGraphExecUpdate_v2", "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy",
        "cuGraphDestroyNode", "cuFuncSetAttribute", "cuFuncSetCacheConfig", "cuKernelSetAttribute", "cuKernelSetCacheConfig",
        "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaRegisterFunction", "__cudaRegisterVar",
        "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC",
        # HIP (shim/hip.c)
        "__hipRegisterFatBinary", "__hipRegisterFunction", "__hipRegisterVar", "__hipUnregisterFatBinary",
        "hipLaunchKernel", "hipLaunchKernel_spt", "hipModuleLaunchKernel", "hipModuleLoadData", "hipModuleLoadDataEx",
        "hipModuleGetFunction", "hipModuleUnload",
    }


@pytest.mark.parametrize("disable", ["0", "1"])
def test_preloading_into_programs_without_cuda_changes_nothing(libproteus, tmp_path, disable):
    env = dict(os.environ, LD_PRELOAD=str(libproteus), PROTEUS_DISABLE=disable, PROTEUS_REPORT=str(tmp_path / "r.json"))
    assert subprocess.run(["/bin/true"], env=env).returncode == 0
    assert subprocess.run(["/bin/false"], env=env).returncode == 1
    ls = subprocess.run(["ls", str(ROOT)], env=env, capture_output=True, text=True)
    assert ls.returncode == 0 and "README.md" in ls.stdout and ls.stderr == ""
    # Python resolves symbols with dlsym while importing extension modules: they must still load.
    py = subprocess.run([sys.executable, "-c", "import ctypes, json, zlib, llvmlite.binding; print('ok')"], env=env,
                        capture_output=True, text=True)
    assert py.stdout.strip() == "ok" and py.stderr == ""
    assert not (tmp_path / "r.json").exists()  # no kernels, no report


EXIT_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void bye(void) { puts("atexit ran"); }
int main(int argc, char **argv) {
  atexit(bye);
  printf("main ran with %d argument(s): %s\n", argc - 1, argc > 1 ? argv[1] : "");   /* buffered: a pipe */
  if (argc > 1 && !strcmp(argv[1], "exit")) exit(9);
  return 7;
}
"""


def test_main_and_exit_keep_their_meaning_under_the_shim(libproteus, tmp_path):
    """The shim wraps main (through __libc_start_main) and exit() so that it can wait for the
    compiler before exit handlers run: arguments, exit codes, atexit handlers and buffered
    output must come through as without it."""
    src = tmp_path / "exits.c"
    src.write_text(EXIT_PROGRAM)
    exe = tmp_path / "exits"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    env = dict(os.environ, LD_PRELOAD=str(libproteus))
    for args, code, out in (([], 7, "main ran with 0 argument(s): \natexit ran\n"),
                            (["exit"], 9, "main ran with 1 argument(s): exit\natexit ran\n")):
        native = subprocess.run([str(exe), *args], capture_output=True, text=True)
        shimmed = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env)
        assert (native.returncode, native.stdout) == (code, out)
        assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (code, out, "")
    assert subprocess.run(["sh", "-c", "exit 3"], env=env).returncode == 3
    assert subprocess.run([sys.executable, "-c", "import sys; sys.exit(5)"], env=env).returncode == 5


def test_rewrite_installs_the_shim_and_its_python_config(samples, tmp_path):
    from ..conftest import run_cli

    proc = run_cli(str(samples / "loop_count"), "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "libproteus.so").is_file()
    cfg = (tmp_path / "proteus-python.cfg").read_text().splitlines()
    lib = next(l.split(" ", 1)[1] for l in cfg if l.startswith("libpython "))
    assert os.path.isfile(lib) and ".so" in lib
    assert f"path {ROOT}" in cfg
    assert f"LD_PRELOAD={tmp_path / 'libproteus.so'}" in proc.stdout
