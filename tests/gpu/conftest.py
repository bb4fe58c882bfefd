"""GPU-test fixtures: the driver's own record of which kernels ran (tests/support/cupti.py)."""

from __future__ import annotations

import pytest

from ..support import cupti


@pytest.fixture(scope="session")
def kernel_trace(tmp_path_factory):
    """kernel_trace(path) -> environment entries making a CUDA process write, at exit, the name
    of every kernel the GPU executed to path (cupti.kernels_run reads it)."""
    build = tmp_path_factory.mktemp("cupti")
    cupti.injection_library(str(build))  # once, and a build failure fails here, plainly
    return lambda path: cupti.trace_env(build, path)
