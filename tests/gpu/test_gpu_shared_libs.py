"""On the GPU: apps whose kernels live in shared libraries run their variants, through the
rewritten executable and through LD_PRELOAD, in the three modes (every launch compiled first,
the defaults cold, warm), with native output and the driver's word (CUPTI) that variants ran;
and the shim's NVTX ranges reach a profiler's injection library."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.lib import cupti

from ..conftest import run_cli
from ..support.apps import run_app
from .test_gpu_shim import SYNC, checksums

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
APPS = ["shared_lib", "shared_lib_dynamic", "two_tu_shared"]


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("how", ["rewritten", "preload"])
def test_kernels_of_a_shared_library_run_specialized(samples, tmp_path, app, how, kernel_trace):
    out = tmp_path / "out"
    proc = run_cli(str(samples / app), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / f"lib{app}.so.kstore").is_file()
    native = run_app(samples / app)
    assert native.returncode == 0 and checksums(native.stdout), native.stderr
    exe, env = (out / app, {}) if how == "rewritten" else (samples / app, {"LD_PRELOAD": str(out / "libproteus.so")})
    cache = tmp_path / "cache"
    for mode, extra in (("sync-cold", SYNC), ("default-cold", {}), ("warm", {})):
        run_cache = tmp_path / "cache-sync" if mode == "sync-cold" else cache
        ran, report = tmp_path / f"{mode}.kernels", tmp_path / f"{mode}.json"
        res = run_app(exe, (), {**env, **extra, "PROTEUS_CACHE_DIR": str(run_cache), "PROTEUS_REPORT": str(report),
                                **kernel_trace(ran)})
        assert res.returncode == 0, (mode, res.stderr)
        assert checksums(res.stdout) == checksums(native.stdout), mode
        assert "warning" not in res.stderr and "Traceback" not in res.stderr, (mode, res.stderr)
        if mode == "default-cold":  # its few launches may all run as built while their variants compile (then stored)
            continue
        names = cupti.kernels_run(ran)
        doc = json.loads(report.read_text())
        lib_kernels = {"polynomial", "smooth", "histogram", "normalize"}
        ran_variants = {n.split("$proteus$")[0] for n in cupti.variants(names)}
        assert any(k in n for n in ran_variants for k in lib_kernels), (mode, names)  # the library's own kernels
        assert not cupti.originals(names), (mode, names)
        assert all(k["specialized_launches"] == k["launches"] > 0 for k in doc["kernels"]), (mode, doc["kernels"])
        if mode == "warm":
            assert all(k["specializations"] == 0 for k in doc["kernels"]), doc["kernels"]


def test_nvtx_ranges_show_what_the_jit_did(samples, recorded_loop_count, tmp_path):
    inject = tmp_path / "libnvtx_log.so"
    subprocess.run(["cc", "-std=gnu11", "-shared", "-fPIC", "-I", str(ROOT / "shim"), str(ROOT / "tests" / "support" / "nvtx_log.c"),
                    "-o", str(inject)], check=True)
    log = tmp_path / "nvtx.log"
    base = {"LD_PRELOAD": str(recorded_loop_count / "libproteus.so"), "NVTX_INJECTION64_PATH": str(inject),
            "NVTX_LOG": str(log)}
    # a miss compiled on a compile thread; one checked against the original on its first launch;
    # one timed against the original (a speed trial takes a few turns of 20,000 launches)
    for extra, launches in (({"PROTEUS_CACHE_DIR": str(tmp_path / "c1"), "PROTEUS_ASYNC_COMPILATION": "1"}, "2000"),
                            ({"PROTEUS_CACHE_DIR": str(tmp_path / "c2"), "PROTEUS_VALIDATE": "1", **SYNC}, "2000"),
                            ({"PROTEUS_CACHE_DIR": str(tmp_path / "c3"), "PROTEUS_SPEED_CHECK": "1", **SYNC}, "20000")):
        res = run_app(samples / "launch_overhead", (launches,), {**base, **extra})
        assert res.returncode == 0, res.stderr
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    pushed = {r[2].split(":")[0] for r in lines if r[1] == "push"}
    assert {"proteus-rewrite miss", "proteus-rewrite compile", "proteus-rewrite validation",
            "proteus-rewrite speed trial"} <= pushed, pushed
    depth: dict[str, int] = {}
    for tid, what, *_ in lines:
        depth[tid] = depth.get(tid, 0) + (what == "push") - (what == "pop")
    assert set(depth.values()) == {0}, depth


@pytest.fixture
def recorded_loop_count(samples, tmp_path):
    out = tmp_path / "lo"
    proc = run_cli(str(samples / "launch_overhead"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out
