"""A recorded app run where there is no usable GPU: the report is still written and says why, and
`validate` says so with its own exit code rather than 12 (a variant differs).

The GPU goes missing in two ways that work on any machine: a fake libcuda.so.1 whose cuInit fails
(CUDA_ERROR_NO_DEVICE), found first on LD_LIBRARY_PATH, and CUDA_VISIBLE_DEVICES="" with the
machine's own driver, if it has one (cuInit fails then too) or without one (it cannot be loaded)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from proteus_rewrite.errors import NoGpuError, ValidationError

from ..conftest import run_cli

FAKE_DRIVER = r"""
int cuInit(unsigned flags) { (void)flags; return 100; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuGetErrorName(int e, const char **s) { *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0; }
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_driver")
    (d / "fake_cuda.c").write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"), str(d / "fake_cuda.c")],
                   check=True, capture_output=True)
    return d


@pytest.fixture(scope="module")
def recorded(samples, tmp_path_factory):
    """name -> the rewritten executable: a static-cudart app and a dynamic-cudart one."""
    out = tmp_path_factory.mktemp("recorded")
    apps = {}
    for name in ("loop_count", "loop_count_dynamic"):
        proc = run_cli(str(samples / name), "-o", str(out / name))
        assert proc.returncode == 0, proc.stderr
        apps[name] = out / name / name
    return apps


def _without_gpu(how: str, fake_driver) -> dict:
    if how == "fake driver":
        return {"LD_LIBRARY_PATH": f"{fake_driver}{os.pathsep}{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("how", ["fake driver", "no visible device"])
@pytest.mark.parametrize("app", ["loop_count", "loop_count_dynamic"])
def test_the_report_says_why_nothing_was_specialized(recorded, fake_driver, tmp_path, app, how):
    report = tmp_path / "run.json"
    env = {**os.environ, **_without_gpu(how, fake_driver), "PROTEUS_REPORT": str(report)}
    proc = subprocess.run([str(recorded[app])], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0  # the app's own CUDA error
    assert report.is_file(), proc.stderr
    doc = json.loads(report.read_text())
    if how == "fake driver":
        assert doc["no_gpu"] == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)", doc
    else:  # this machine's driver: missing, or present with no device to show
        assert doc["no_gpu"].startswith(("the CUDA driver cannot be loaded (", "cuInit failed: ")), doc
    assert not any(k.get("specialized_launches") for k in doc["kernels"])
    shown = run_cli("report", str(report))
    assert shown.returncode == 0, shown.stderr
    assert f"no usable GPU ({doc['no_gpu']}): nothing was specialized" in shown.stdout


@pytest.mark.parametrize("how", ["fake driver", "no visible device"])
def test_validate_without_a_gpu_says_so_in_one_line_with_its_own_code(recorded, fake_driver, monkeypatch, how):
    for name, value in _without_gpu(how, fake_driver).items():
        monkeypatch.setenv(name, value)
    proc = run_cli("validate", str(recorded["loop_count"]))
    assert proc.returncode == NoGpuError.exit_code != ValidationError.exit_code, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("proteus-rewrite")]
    assert len(ours) == 1 and ours[0].startswith(f"proteus-rewrite: error: {recorded['loop_count']}: no usable GPU: "), proc.stderr
    if how == "fake driver":
        assert ours[0].endswith(": cuInit failed: CUDA_ERROR_NO_DEVICE (100)")


RANKS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "FLUX_TASK_RANK")


@pytest.mark.parametrize("ranks, name", [
    ({"SLURM_PROCID": "7", "PMI_RANK": "3"}, "run.7.json"),  # the first variable set wins, as in jobenv.rank
    ({"SLURM_PROCID": "x", "OMPI_COMM_WORLD_RANK": " 05 "}, "run.5.json"),  # not a rank: passed over
    ({}, "run.{pid}.json"),  # no rank: the pid
])
def test_the_shims_own_report_fills_in_the_rank(recorded, fake_driver, tmp_path, ranks, name):
    """The counters-only report the shim writes when Python never starts (here: no GPU) expands
    %r, %p and %% in PROTEUS_REPORT as the Python writer does (jobenv.expand_path)."""
    env = {k: v for k, v in os.environ.items() if k not in RANKS}
    env.update(_without_gpu("fake driver", fake_driver), **ranks, PROTEUS_REPORT=str(tmp_path / "run.%r.json"))
    proc = subprocess.run([str(recorded["loop_count"])], env=env, capture_output=True, text=True, timeout=120)
    written = [p.name for p in tmp_path.iterdir()]
    assert len(written) == 1, (written, proc.stderr)
    doc = json.loads((tmp_path / written[0]).read_text())
    assert doc["no_gpu"] and written[0] == name.format(pid=doc["pid"])
    env["PROTEUS_REPORT"] = str(tmp_path / "p" / "%p.%%r.%q.json")
    (tmp_path / "p").mkdir()
    proc = subprocess.run([str(recorded["loop_count"])], env=env, capture_output=True, text=True, timeout=120)
    (only,) = (tmp_path / "p").iterdir()
    assert only.name == f"{json.loads(only.read_text())['pid']}.%r.%q.json", proc.stderr
