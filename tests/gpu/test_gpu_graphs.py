"""Kernels run as CUDA graph nodes (shim/cuda_graph.c): captured launches, nodes added by
hand, nodes given new arguments on the executable graph, whole-graph updates. Output as
native in every mode, and the driver's record (CUPTI) of which code each replay ran."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench.lib import cupti

from ..conftest import run_cli
from .test_gpu_shim import checksums, run, shim_env

pytestmark = pytest.mark.gpu

# every launch waits for its variant; the defaults with an empty cache; the same cache again
MODES = (("sync", "0", "cache-sync"), ("cold", "auto", "cache-default"), ("warm", "auto", "cache-default"))


def test_graph_nodes_run_variants_for_their_own_arguments(samples, tmp_path, kernel_trace):
    """graph_params: a capture (a kernel's first launch inside it, a specialized one again), the
    captured node's scalar changed through the driver's SetParams; a graph built by hand with
    cudaGraphAddKernelNode, its node's scalar set through the runtime's SetParams, then the
    executable graph updated from another graph (cudaGraphExecUpdate). 19 kernels run in all:
    10 graph replays of the capture, 3 launches, 6 replays of the hand-built graph."""
    exe = samples / "graph_params"
    out = tmp_path / "rec"
    proc = run_cli(str(exe), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    native = run(exe)
    assert native.returncode == 0, native.stderr
    assert set(checksums(native.stdout)) == {"graph", "graph_updated", "after", "hand", "hand_set", "hand_update"}
    for mode, async_mode, cache in MODES:
        ran = tmp_path / f"{mode}.kernels"
        report = tmp_path / f"{mode}.json"
        proc = run(exe, {**shim_env(out, tmp_path / cache, report, PROTEUS_ASYNC_COMPILATION=async_mode), **kernel_trace(ran)})
        assert proc.returncode == 0, proc.stderr
        assert checksums(proc.stdout) == checksums(native.stdout), mode
        kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
        assert sum(k["launches_captured"] for k in kernels.values()) == 2, kernels
        names = cupti.kernels_run(ran)
        assert len(names) == 19, names
        if mode != "cold":   # cold: a node runs the original until its variant lands
            assert cupti.originals(names) == [], (mode, names)
            # nodes pointed at a variant: bump at the capture's instantiation, by hand, by
            # SetParams and by the update; scale_add at instantiation and by SetParams
            assert {n: k["graph_nodes_specialized"] for n, k in kernels.items()} == \
                {"_Z4bumpPffi": 4, "_Z9scale_addPfPKffi": 2}, kernels


def test_a_waiting_node_runs_its_variant_once_it_lands(samples, tmp_path, kernel_trace):
    """graph_params MS, cold with the defaults: `fill`, a node never launched otherwise, has its
    variant queued at instantiation; the app destroys the template at once (the shim puts that
    off while the node waits) and replays the exec once a millisecond. The replays run the
    original until the variant has compiled, then, re-pointed at a launch, the variant: CUPTI
    shows the original first and the variant last."""
    exe = samples / "graph_params"
    out = tmp_path / "rec"
    assert run_cli(str(exe), "-o", str(out)).returncode == 0
    native = run(exe, args=("3000",))
    assert native.returncode == 0 and "fill" in checksums(native.stdout), native.stderr
    ran, report = tmp_path / "cold.kernels", tmp_path / "cold.json"
    proc = run(exe, {**shim_env(out, tmp_path / "cache", report, PROTEUS_ASYNC_COMPILATION="auto"), **kernel_trace(ran)},
               ("3000",))
    assert proc.returncode == 0, proc.stderr
    assert checksums(proc.stdout) == checksums(native.stdout)
    fills = [n for n in cupti.kernels_run(ran) if n.startswith("_Z4fillPffi")]
    assert len(fills) > 100 and "$proteus$" not in fills[0] and "$proteus$" in fills[-1], (len(fills), fills[:3], fills[-3:])
    kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
    assert kernels["_Z4fillPffi"]["graph_nodes_specialized"] == 1, kernels["_Z4fillPffi"]


GRAPH_PROGRAMS = os.environ.get("GRAPH_PROGRAMS")
# (program, arguments, kernels that run as graph nodes)
REAL = [("jacobiCudaGraphs", ("-gpumethod=0",), {"JacobiMethod"}),   # cudaGraphExecKernelNodeSetParams each iteration
        ("jacobiCudaGraphs", ("-gpumethod=1",), {"JacobiMethod"}),   # a capture applied by cudaGraphExecUpdate each iteration
        ("simpleCudaGraphs", (), {"reduce", "reduceFinal"}),          # by hand, captured, cloned
        ("graphMemoryNodes", (), {"squareArray", "negateArray"}),     # between memory nodes
        ("graphExecution", (), {"reduce", "reduceFinal"})]            # HeCBench: capture, 100s of replays
TIMING = re.compile(r"time", re.IGNORECASE)


def comparable(stdout: str, unstable: set[int]) -> list[str]:
    return [l for i, l in enumerate(stdout.splitlines()) if i not in unstable and not TIMING.search(l)]


@pytest.mark.skipif(not GRAPH_PROGRAMS, reason="GRAPH_PROGRAMS unset: builds of bench/graph_programs.py")
@pytest.mark.parametrize("program,args,graph_kernels", REAL, ids=[f"{p}{''.join(a)}" for p, a, _ in REAL])
def test_real_programs_run_graph_nodes_specialized(tmp_path, kernel_trace, program, args, graph_kernels):
    """NVIDIA's cuda-samples and HeCBench, as published (bench/graph_programs.py builds them):
    output as native (timings and lines two native runs disagree on left out), and with every
    variant compiled before it is needed, and warm, every kernel the GPU ran was a variant."""
    exe = Path(GRAPH_PROGRAMS) / "recommended" / program
    natives = [run(exe, args=args) for _ in range(2)]
    assert all(p.returncode == 0 for p in natives), natives[0].stderr
    a, b = (p.stdout.splitlines() for p in natives)
    unstable = {i for i, (x, y) in enumerate(zip(a, b)) if x != y}
    expected = comparable(natives[0].stdout, unstable)
    out = tmp_path / "rec"
    proc = run_cli(str(exe), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    for mode, async_mode, cache in MODES:
        ran = tmp_path / f"{mode}.kernels"
        report = tmp_path / f"{mode}.json"
        proc = run(exe, {**shim_env(out, tmp_path / cache, report, PROTEUS_ASYNC_COMPILATION=async_mode), **kernel_trace(ran)}, args)
        assert proc.returncode == 0, (mode, proc.stderr)
        assert comparable(proc.stdout, unstable) == expected, mode
        if mode == "cold":   # a short program may end before a variant compiling in the background lands
            continue
        names = cupti.kernels_run(ran)
        kernels = json.loads(report.read_text())["kernels"]
        nodes = {k["name"]: k["graph_nodes_specialized"] for k in kernels}
        assert all(any(g in n for n in nodes if nodes[n]) for g in graph_kernels), (mode, nodes)
        assert names and cupti.originals(names) == [], (mode, sorted(set(names)))
        assert {n.split("$proteus$")[0] for n in cupti.variants(names)} >= {n for n in nodes if nodes[n]}, mode
