"""The command line as a user runs it."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from proteus_rewrite import __version__, store

from ..conftest import run_cli


def test_version_and_help_with_examples():
    v = run_cli("--version")
    assert v.returncode == 0 and __version__ in v.stdout
    h = run_cli("--help")
    assert h.returncode == 0
    assert "Examples:" in h.stdout and "proteus-rewrite inspect ./app --json" in h.stdout
    assert "Exit codes:" in h.stdout


def test_rewrite_defaults_to_proteus_out_app_and_leaves_the_input_alone(samples, tmp_path):
    app = samples / "loop_count"
    before = hashlib.sha256(app.read_bytes()).hexdigest()
    proc = run_cli(str(app), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "proteus-out" / "loop_count" / "loop_count.kstore"
    assert out.is_file() and str(out.relative_to(tmp_path)) in proc.stdout
    assert "recorded 3 kernel(s), 3 with bitcode" in proc.stdout
    assert hashlib.sha256(app.read_bytes()).hexdigest() == before
    assert store.read(out).app.sha256 == before


def test_rewrite_with_output_directory(samples, tmp_path):
    proc = run_cli(str(samples / "two_tu"), "-o", str(tmp_path / "jit"))
    assert proc.returncode == 0, proc.stderr
    assert len(store.read(tmp_path / "jit" / "two_tu.kstore").kernels) == 3


def test_inspect_lists_every_kernel(samples):
    proc = run_cli("inspect", str(samples / "templates"))
    assert proc.returncode == 0, proc.stderr
    for name in ("void scale_add<float, 4>(float*, float const*, float, int)", "affine(Affine, float const*, float*)",
                 "bounded_sum(float const*, float*, int, int)"):
        assert name in proc.stdout
    assert "128x1x1, min 4/SM" in proc.stdout
    assert "5 kernel(s), 5 with bitcode" in proc.stdout


def test_inspect_json_is_complete_and_matches_the_store(samples, tmp_path):
    proc = run_cli("inspect", "--json", str(samples / "device_globals"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["app"]["cudart"] == "static"
    assert {k["name"] for k in doc["kernels"]} == {"_Z10accumulatePKfi", "_Z5applyPfPKfi"}
    assert all(k["has_bitcode"] and k["globals"] == ["coeffs", "hits", "table"] for k in doc["kernels"])
    assert doc["modules"][0]["size"] > 0 and "bitcode" not in doc["modules"][0]
    run_cli(str(samples / "device_globals"), "-o", str(tmp_path))
    from_store = json.loads(run_cli("inspect", "--json", str(tmp_path / "device_globals.kstore")).stdout)
    assert from_store["kernels"] == doc["kernels"]


def test_inspect_names_each_kernels_route_in_a_mixed_build(samples):
    proc = run_cli("inspect", str(samples / "mixed_nvcc"))
    assert proc.returncode == 0 and not proc.stderr
    assert "3 kernel(s), 1 with bitcode, 2 from PTX" in proc.stdout
    rows = {line.split("(")[0].split()[-1]: line for line in proc.stdout.splitlines() if "module" in line and "│" in line}
    assert "bitcode, module" in rows["square"] and "PTX, module" in rows["histogram"]
    assert "ptr, i32, ptr, i32" in rows["histogram"]  # from the .entry signature and the demangled name


def test_unknown_option_is_a_usage_error():
    proc = run_cli("inspect", "--nope", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_specialize_prints_ptx_with_the_folded_values(samples):
    proc = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", "--arg", "0=1048576", "--arg", "1=8",
                   "--arg", "2=0.5", "--block", "256", "--emit", "ptx")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("fma.rn.f32") == 8 and ".maxntid 256, 1, 1" in proc.stdout
    assert "folded   arg 0 = 1048576, arg 1 = 8, arg 2 = 0.5" in proc.stderr
    ir = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", "--arg", "0=1048576", "--arg", "1=8",
                 "--arg", "2=0.5", "--block", "256", "--emit", "ir")
    assert ir.returncode == 0, ir.stderr
    # the optimizer's output, as the backend got it: the loop unrolled, the multiply-adds not yet
    # fused and the pointers not yet moved to the global address space (the backend's own passes)
    assert ir.stdout.count("fmul contract float") == 8, ir.stdout[:3000]
    assert "llvm.fma" not in ir.stdout and "addrspacecast" not in ir.stdout


@pytest.mark.parametrize("threshold, fmas", [(None, 20), ("100000", 200)])
def test_the_unroll_threshold_decides_how_far_a_folded_loop_unrolls(samples, monkeypatch, threshold, fmas):
    """LLVM's -unroll-threshold is process-wide: each specialize command is a process of its own.
    200 steps of axpy_loop: partly unrolled by LLVM's own threshold, fully at 100000."""
    if threshold is None:
        monkeypatch.delenv("PROTEUS_UNROLL_THRESHOLD", raising=False)
    else:
        monkeypatch.setenv("PROTEUS_UNROLL_THRESHOLD", threshold)
    proc = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", "--arg", "0=1048576", "--arg", "1=200",
                   "--arg", "2=0.5", "--block", "256", "--emit", "ptx")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("fma.rn.f32") == fmas


def test_specialize_writes_a_cubin_and_ir(samples, tmp_path):
    out = tmp_path / "k.cubin"
    proc = run_cli("specialize", str(samples / "templates"), "bounded_sum", "--arg", "2=4096", "--block", "128",
                   "--emit", "cubin", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"
    ir = run_cli("specialize", str(samples / "templates"), "bounded_sum", "--emit", "ir")  # block: its bound, 128
    assert ir.returncode == 0, ir.stderr
    # the variant's own name: a profiler (and the GPU tests' CUPTI trace) tells it from the original
    assert re.search(r'define ptx_kernel void @"_Z11bounded_sumPKfPfii\$proteus\$[0-9a-f]{12}"\(', ir.stdout), ir.stdout[:2000]
    assert '"nvvm.minctasm"="4"' in ir.stdout


def test_specialize_bad_arguments_are_usage_errors(samples):
    for args in (["--arg", "9=1"], ["--arg", "1=notanumber"], ["--block", "0"]):
        proc = run_cli("specialize", str(samples / "loop_count"), "axpy_loop", *args)
        assert proc.returncode in (2, 9), proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_cli("specialize", str(samples / "loop_count"), "nope")
    assert proc.returncode == 2 and "axpy_loop(int, int, float" in proc.stderr


def test_cache_commands(samples, tmp_path):
    import os

    env_dir = str(tmp_path / "cache")
    os.environ["PROTEUS_CACHE_DIR"] = env_dir
    try:
        from proteus_rewrite.cache import make_chain
        from proteus_rewrite.fatbin import extract
        from proteus_rewrite.jit import Config, specialize

        from ..support.launches import kernel, launch_for

        t = extract(samples / "loop_count")
        k = kernel(t, "axpy_loop")
        specialize(t, k, launch_for(k, {1: "8"}), Config.from_env({}), make_chain(True, env_dir))
        ls = run_cli("cache", "ls")
        assert ls.returncode == 0 and "axpy_loop" in ls.stdout and "1 entry" in ls.stdout
        stats = run_cli("cache", "stats")
        assert "entries    1" in stats.stdout
        clear = run_cli("cache", "clear")
        assert "removed 1 entry" in clear.stdout
        assert "entries    0" in run_cli("cache", "stats").stdout
    finally:
        del os.environ["PROTEUS_CACHE_DIR"]


REPORT = {
    "tool": "proteus-rewrite 0.1.0", "pid": 42, "seconds": 1.5, "driver_version": 13000, "unknown_handle_launches": 3,
    "shim_wait_ms": {"python_start": 61.5, "misses": 310.25, "miss_count": 12, "prepare_compiler": 0.0, "exit": 4.5,
                     "compiling": 93.5, "compiling_count": 5, "deferred_count": 10},
    "prestart": {"python": True, "compiler": False},
    "threads_ms": {"app_main_wall": 1400.5, "app_main_cpu": 900.25, "compile_threads_cpu": 120.0, "prestart_cpu": 210.0,
                   "after_main": 4.5, "report": 0.2},
    "kernels": [
        {"name": "_Z4stepPfi", "demangled": "step(float*, int)", "launches": 1000, "specialized_launches": 900,
         "specializations": 10, "memory_cache_hits": 1, "disk_cache_hits": 2, "compile_ms": 123.4,
         "launches_while_compiling": 40, "budget_refusals": 50, "fallback_launches": 100,
         "failures": {"ptx: injected fault": 2}, "tracker": {"stopped_folding": ["1"]},
         "not_compiled": [{"args": {}, "grid": [1, 1, 1], "block": [1, 1, 1], "arch": 90}]},
        {"name": "_Z4idlev", "demangled": "idle()", "launches": 0, "specialized_launches": 0, "specializations": 0,
         "fallback_launches": 0},
    ],
}


def test_report_summarizes_a_run_per_kernel(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(REPORT))
    r = run_cli("report", str(path))
    assert r.returncode == 0, r.stderr
    assert "3 launches of kernels the shim never saw registered" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("step(float*, int)"))
    assert "1,000" in line and "90.0%" in line and "1/2" in line and "123.4" in line and "40 / 50 / 10" in line
    assert "step(float*, int): 2 x ptx: injected fault" in r.stdout
    assert ("the app waited on the shim 310.25 ms over 12 misses (10 kept for the value tracker, with no call into "
            "Python) and 4.5 ms at exit; Python started in 61.5 ms on the "
            "prestart thread, beside the app") in r.stdout and "compiler" not in r.stdout.splitlines()[1]
    assert "; 5 launches waited 93.5 ms in all for a variant compiling in the background" in r.stdout
    assert "step(float*, int): 1 variant(s) queued but never compiled (the tracker moved past them" in r.stdout
    assert ("main() ran 1400.5 ms (900.25 ms of its thread's CPU); the compile threads used 120.0 ms of CPU and the "
            "prestart thread 210.0 ms, beside it") in r.stdout
    summary = json.loads(run_cli("report", "--json", str(path)).stdout)
    assert summary["shim_wait_ms"]["miss_count"] == 12 and summary["threads_ms"]["compile_threads_cpu"] == 120.0
    path.write_text(json.dumps({**REPORT, "threads_ms": {"app_main_wall": "soon", "app_main_cpu": True}}))
    r = run_cli("report", str(path))  # figures that are not numbers are left out, not a traceback
    assert r.returncode == 0 and "main() ran" not in r.stdout, r.stderr
    rows = summary["kernels"]
    assert rows[0]["specialized"] == 900 and rows[0]["unfolded_by_tracker"] == ["1"] and rows[1]["launches"] == 0
    # where the variants compiled: a compiler process started by the prestart thread, one of which died
    path.write_text(json.dumps({**REPORT, "prestart": {"python": True, "compiler": True},
                                "compiler_process": {"python": "/usr/bin/python3", "processes_started": 2, "deaths": 1}}))
    r = run_cli("report", str(path))
    assert "beside the app; the compiler process was started there" in r.stdout
    assert "1 compiler process(es) died; their variants ran the original kernels" in r.stdout
    assert json.loads(run_cli("report", "--json", str(path)).stdout)["compiler_process"]["deaths"] == 1


def test_report_refuses_what_is_not_a_report(tmp_path):
    for content in ("{", "[]", '{"kernels": [{"launches": 1}]}'):
        path = tmp_path / "bad.json"
        path.write_text(content)
        r = run_cli("report", str(path))
        assert r.returncode == 3 and "not a PROTEUS_REPORT file" in r.stderr and "Traceback" not in r.stderr, (content, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("report", str(tmp_path / "missing.json"))
    assert r.returncode == 3 and "missing.json: cannot read" in r.stderr
