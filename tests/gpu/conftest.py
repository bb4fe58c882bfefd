"""GPU-test fixtures: the driver's own record of which kernels ran (bench/lib/cupti.py)."""

from __future__ import annotations

import pytest

from bench.lib import cupti


@pytest.fixture(scope="session")
def kernel_trace(tmp_path_factory):
    """kernel_trace(path) -> environment entries making a CUDA process write, at exit, the name
    of every kernel the GPU executed to path (cupti.kernels_run reads it)."""
    build = tmp_path_factory.mktemp("cupti")
    cupti.injection_library(str(build))  # once, and a build failure fails here, plainly
    return lambda path: cupti.trace_env(build, path)


@pytest.fixture(autouse=True)
def _speed_check_off(request, monkeypatch):
    """Speed trials off in every GPU test but test_speed.py's: a trial runs some launches on the
    original and may drop a variant timed slower on this GPU, so the exact launch counts the
    other tests assert (every launch specialized, by CUPTI) would depend on timing noise.
    test_speed.py tests the trials, and runs the samples with the defaults."""
    if request.node.path.name != "test_speed.py":
        monkeypatch.setenv("PROTEUS_SPEED_CHECK", "0")


@pytest.fixture(autouse=True)
def _check_off(monkeypatch):
    """The default check (PROTEUS_VALIDATE) off in every GPU test but those that ask for it
    ("once", or "1"): a variant's first launch runs the original and the variant once more in its
    shadow, so the exact launch counts the other tests assert, by CUPTI, would move by the checks.
    test_validate.py runs the default mode over the samples and tests what it catches."""
    monkeypatch.setenv("PROTEUS_VALIDATE", "0")
