"""Concurrency on the GPU: many processes sharing one cache directory, and one process
launching from 8 threads on their own streams. Every result is checked by the app itself."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from proteus_rewrite import cache as cache_mod

from ..conftest import run_cli

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def recorded(samples, tmp_path_factory):
    d = tmp_path_factory.mktemp("changing_scalars")
    assert run_cli(str(samples / "changing_scalars"), "-o", str(d)).returncode == 0
    return d


def test_sixteen_processes_share_one_cache_directory(samples, recorded, tmp_path):
    cache = tmp_path / "cache"
    procs = []
    for i in range(16):
        env = dict(os.environ, LD_PRELOAD=str(recorded / "libproteus.so"), PROTEUS_CACHE_DIR=str(cache),
                   PROTEUS_CACHE_MAX_MB="0.25", PROTEUS_REPORT=str(tmp_path / f"r{i}.json"),
                   PROTEUS_TRACKER="0", PROTEUS_COMPILE_BUDGET="0",  # every value a variant: a cache stress test
                   PROTEUS_ASYNC_COMPILATION="0")  # each compiled before its launch
        # 1,000 launches, 200 distinct values of the changing scalar: 200 variants, more than the 0.25 MB cap
        procs.append(subprocess.Popen([str(samples / "changing_scalars"), "1000", "200", "1"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]  # a deadlock would end here, failed
    native = subprocess.run([str(samples / "changing_scalars"), "1000", "200", "1"], capture_output=True, text=True)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "verified 1000 launches" in out and out == native.stdout
        assert "warning" not in err, err
    entries = list(cache.glob("*.pjc"))
    assert entries and all(cache_mod.decode(e.read_bytes(), e.name[:-4]) is not None for e in entries)  # 0 corrupt
    assert sum(e.stat().st_size for e in entries) <= 256 * 1024  # the cap holds
    assert not list(cache.glob(".tmp-*"))
    reports = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(16)]
    assert all(k["specialized_launches"] == 1000 for r in reports for k in r["kernels"])
    assert sum(r["cache"]["disk"]["evicted"] for r in reports) > 0  # the cap was exercised


@pytest.mark.parametrize("mode", ["0", "auto"])
def test_eight_threads_on_eight_streams(samples, recorded, tmp_path, mode):
    """16 values over 1,000 launches on 8 threads. Compiled on the launching thread (0), every
    launch is specialized; in the background (auto, the default), launches that ask for a
    variant still compiling wait for it or run the original, from 8 threads at once."""
    native = subprocess.run([str(samples / "changing_scalars"), "1000", "16", "8"], capture_output=True, text=True)
    assert native.returncode == 0
    env = dict(os.environ, LD_PRELOAD=str(recorded / "libproteus.so"), PROTEUS_CACHE_DIR=str(tmp_path / "c"),
               PROTEUS_REPORT=str(tmp_path / "r.json"), PROTEUS_ASYNC_COMPILATION=mode)
    for run in ("cold", "warm"):
        jit = subprocess.run([str(samples / "changing_scalars"), "1000", "16", "8"], capture_output=True, text=True,
                             env=env, timeout=600)
        assert jit.returncode == 0, jit.stderr
        assert jit.stdout == native.stdout and "verified 1000 launches on 8 thread(s)" in jit.stdout
        doc = json.loads((tmp_path / "r.json").read_text())
        (k,) = doc["kernels"]
        assert doc["async_compilation"] == mode and not k["failures"] and k["launch_errors"] == 0
        if mode == "0" or run == "warm":  # auto: the cold run's compile threads finished their queue at exit
            assert k["specialized_launches"] == k["launches"] == 1000 and k["fallback_launches"] == 0
        else:  # a 10 ms run: it may end before the first variant has compiled
            assert k["specialized_launches"] + k["fallback_launches"] == 1000
