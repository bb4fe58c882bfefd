"""The CPU micro-benchmarks (bench/micro/) run briefly: every row they promise, and their
argument errors. The times are the benchmarks', never asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.lib.paths import ROOT, SAMPLES_BUILD


def _micro(name: str, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """python -m bench.micro.NAME ARGS from the repository's top, as `make bench` runs it."""
    return subprocess.run([sys.executable, "-m", f"bench.micro.{name}", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_hitpath_bench_times_every_key_shape(tmp_path):
    r = _micro("hitpath_bench", "--iterations", "2000", "--out", str(tmp_path), "--tag", "t")
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("hitpath-*-t.json")
    shapes = json.loads(path.read_text())["shapes"]
    assert len(shapes) == 9 and all(s["ns_per_hit"] > 0 and len(s["timings"]) == 5 for s in shapes.values())
    assert [s["key_bytes"] for s in shapes.values()] == [36, 16, 92, 220, 36, 36, 36, 36, 36]  # gen + folded args + block/grid
    assert [s["evicted_kib_per_launch"] for s in shapes.values()] == [0, 0, 0, 0, 1024, 4096, 16384, 1024, 16384]
    # the last two: the variant still compiling, each launch runs the original (hitpath exits 1 otherwise)
    assert [s["variant_compiling"] for s in shapes.values()] == [False] * 7 + [True] * 2
    bad = _micro("hitpath_bench", "--iterations", "0")
    assert bad.returncode == 2 and "--iterations must be positive" in bad.stderr
    bad = _micro("hitpath_bench", "--shim", str(tmp_path))
    assert bad.returncode == 2 and "no cuda.c there" in bad.stderr


def test_exit_cost_times_every_stage(tmp_path):
    r = _micro("exit_cost", "--reps", "1", "--out", str(tmp_path), "--tag", "t", timeout=600)
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("exitcost-*-t.json")
    stages = json.loads(path.read_text())["stages"]
    assert list(stages) == ["bare interpreter", "runtime imported", "LLVM target machine", "compiler warmed up"]
    assert all(s["exit_ms_median"] > 0 and len(s["exit_ms"]) == 1 for s in stages.values())
    # each stage loads more than the one before (the exit times are the benchmark's, not asserted)
    rss = [s["max_rss_mb"] for s in stages.values()]
    assert rss == sorted(rss) and rss[-1] > rss[1]
    bad = _micro("exit_cost", "--reps", "0")
    assert bad.returncode == 2 and "--reps must be positive" in bad.stderr


def test_miss_bench_times_both_shapes(tmp_path):
    """Needs the changing_scalars sample (make test builds it); the times are the benchmark's."""
    if not (SAMPLES_BUILD / "changing_scalars").is_file():
        pytest.fail("samples/build/changing_scalars is missing: build the samples first (python3 samples/build.py)")
    r = _micro("miss_bench", "--reps", "1", "--misses", "20", "--out", str(tmp_path), "--tag", "t", timeout=600)
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("miss-*-t.json")
    rows = json.loads(path.read_text())["rows"]
    assert list(rows) == ["two calls, alone", "two calls, during the warm-up", "one call, alone", "one call, during the warm-up"]
    assert rows["one call, alone"]["misses"] == 20 and all(r["median_ms"] > 0 for r in rows.values())
    for args, message in ((["--reps", "0"], "must be positive"), (["--shapes", "three calls"], "unknown shape 'three calls'")):
        bad = _micro("miss_bench", *args)
        assert bad.returncode == 2 and message in bad.stderr


def test_ptx_sweep_assembles_an_nvcc_samples_kernels(samples, tmp_path):
    out = tmp_path / "sweep.json"
    r = _micro("ptx_sweep", str(samples / "loop_count_nvcc"), "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "loop_count_nvcc: 3 kernels, 3 on the PTX route, 3 of 3 swept assembled" in r.stdout
    (doc,) = json.loads(out.read_text())
    assert doc["assembled"] == 3 and doc["failures"] == {}


def test_ptx_sweep_passes_settings_to_the_specializer(samples):
    """--env: the specializer's settings; a bad one is a one-line usage error."""
    r = _micro("ptx_sweep", str(samples / "loop_count_nvcc"), "--env", "PROTEUS_PTX_FOLD_FLOATS=1", timeout=300)
    assert r.returncode == 0 and "3 of 3 swept assembled" in r.stdout, r.stderr
    r = _micro("ptx_sweep", str(samples / "loop_count_nvcc"), "--env", "PROTEUS_UNROLL_THRESHOLD=many", timeout=300)
    assert r.returncode == 2 and "PROTEUS_UNROLL_THRESHOLD='many'" in r.stderr and "Traceback" not in r.stderr
    r = _micro("ptx_sweep", str(samples / "loop_count_nvcc"), "--env", "FOLD=1", timeout=300)
    assert r.returncode == 2 and "expected PROTEUS_NAME=VALUE" in r.stderr
