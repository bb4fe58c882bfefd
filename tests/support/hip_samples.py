"""The HIP sample apps (samples/build_hip.py), built once per session, or a skip that says
which tool is missing (CI installs them all through scripts/install-deps)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from samples import build_hip

HIP_SAMPLES = Path(build_hip.HERE) / "build" / "hip"


@lru_cache(maxsize=None)
def _build() -> tuple[str, str]:
    return build_hip.build_for_tests("clang++-19")


def hip_samples() -> Path:
    status, why = _build()
    if status == "failed":
        pytest.fail(why)
    if status == "missing":
        pytest.skip(why)
    return HIP_SAMPLES
