"""The benchmark workloads (bench/corpora/apps/): every kernel recorded with bitcode, and each main
kernel specialized offline with its scalars folded out of the code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib.paths import APPS_BUILD, ROOT

from ..conftest import run_cli

# app -> kernels it launches, and its main kernel: (name, {parameter index: value}, block, grid)
APPS = {
    "adam": (["adam_update"],
             ("adam_update", {4: "0.9", 5: "0.999", 6: "1e-8", 7: "256.0", 8: "0.001", 9: "10", 10: "4194304", 11: "1",
                              12: "0.0"}, (256, 1, 1), (4096, 1, 1))),
    "rsbench": (["xs_lookup"],
                ("xs_lookup", {10: "1048576", 11: "42", 12: "12", 13: "64", 14: "148", 15: "1497", 16: "4", 17: "1",
                               18: "4", 19: "0.02"}, (256, 1, 1), (4096, 1, 1))),
    "wsm5": (["wsm5_column"],
             ("wsm5_column", {7: "262144", 8: "28", 9: "20.0", 10: "9.81", 11: "1004.5", 12: "2.5e6", 13: "287.04",
                              14: "1e-12", 15: "1e-3", 16: "2.2", 17: "30.0", 18: "0.25", 19: "1.28"},
              (128, 1, 1), (2048, 1, 1))),
    "feynman_kac": (["feynman_kac"],
                    ("feynman_kac", {2: "3.0", 3: "2.0", 4: "1.5", 5: "0.001", 6: "16", 7: "100000", 8: "48", 9: "48",
                                     10: "48"}, (128, 1, 1), (864, 1, 1))),
    "sw4ck": (["flux_x", "flux_y", "flux_z", "update", "boundary"],
              ("update", {7: "160", 8: "160", 9: "160", 10: "2", 11: "0.006289308176100629",
                          12: "0.0015723270440251573"}, (128, 1, 1), (2, 152, 152))),
    "lulesh": (["calc_corner_forces", "gather_nodal_forces", "update_nodes", "calc_kinematics", "calc_viscosity",
                "calc_eos", "calc_courant", "time_control"],
               ("calc_eos", {0: "262144", 9: "1.4", 10: "1e-7", 11: "1e-7", 12: "0.0", 13: "0.0"}, (256, 1, 1),
                (1024, 1, 1))),
}


@pytest.fixture(scope="module")
def bench_apps() -> Path:
    """bench/corpora/apps/build/, built (or brought up to date) by bench/corpora/apps/build.py;
    where clang is absent, the apps built elsewhere are used as they are, and without them the
    tests skip."""
    have_clang = shutil.which(os.environ.get("CLANG", "clang++-19")) is not None
    if not have_clang:
        if all((APPS_BUILD / a).exists() for a in APPS):
            return APPS_BUILD
        pytest.skip("bench/corpora/apps/build/ is not built and clang++-19 is absent to build it")
    proc = subprocess.run([sys.executable, "-m", "bench.corpora.apps.build"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        pytest.fail(f"building the benchmark apps failed:\n{proc.stdout}{proc.stderr}")
    return APPS_BUILD


def _short(demangled: str) -> str:
    return demangled.split("(")[0].split("<")[0].split()[-1]


@pytest.mark.parametrize("app", list(APPS))
def test_every_kernel_of_a_workload_is_recorded_with_bitcode(bench_apps, app, tmp_path):
    from proteus_rewrite.fatbin import extract

    table = extract(bench_apps / app)
    names = sorted(_short(k.demangled) for k in table.kernels)
    assert names == sorted(APPS[app][0])
    assert all(k.module is not None for k in table.kernels), [k.demangled for k in table.kernels if k.module is None]
    proc = run_cli(str(bench_apps / app), "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / f"{app}.kstore").exists()


@pytest.mark.parametrize("app", list(APPS))
def test_main_kernel_specializes_with_its_scalars_folded(bench_apps, app):
    from proteus_rewrite.fatbin import extract
    from proteus_rewrite.jit import Config, Launch, specialize
    from proteus_rewrite.jit.launch import parse_value

    table = extract(bench_apps / app)
    name, values, block, grid = APPS[app][1]
    (kernel,) = [k for k in table.kernels if _short(k.demangled) == name]
    raw = []
    for p in kernel.params:
        if p.index in values:
            assert p.kind in ("int", "float"), f"{name} parameter {p.index} is {p.kind}, not a scalar"
            raw.append(parse_value(p, values[p.index]))
        else:
            raw.append((0x7F0000000000 + 0x100000 * p.index).to_bytes(p.size, "little"))
    config = Config.from_env({"PROTEUS_PTX_COMPILER": "ptxas"}) if shutil.which("ptxas") else Config.from_env({})
    result = specialize(table, kernel, Launch(tuple(raw), grid, block, 90, {}), config)
    assert set(result.folded) == set(values)
    ptx = result.ptx.text if hasattr(result.ptx, "text") else str(result.ptx)
    # a folded scalar is a constant in the code: its parameter is never loaded
    loaded = [i for i in values if f"_param_{i}]" in ptx]
    assert not loaded, f"{name}: folded parameters still read from the parameter space: {loaded}"
    assert f".maxntid {block[0]}, {block[1]}, {block[2]}" in ptx
