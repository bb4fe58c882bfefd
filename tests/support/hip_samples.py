"""The HIP sample apps (samples/build_hip.py), built once per session, or a skip that says
which tool is missing (CI installs them all through scripts/install-deps)."""

from __future__ import annotations

import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIP_SAMPLES = ROOT / "samples" / "build" / "hip"


@lru_cache(maxsize=None)
def _build() -> tuple[bool, str]:
    sys.path.insert(0, str(ROOT / "samples"))
    import build_hip

    missing = build_hip.missing_tools("clang++-19")
    if missing:
        return False, f"HIP samples need {', '.join(missing)} (scripts/install-deps installs them)"
    proc = subprocess.run([sys.executable, str(ROOT / "samples" / "build_hip.py")], capture_output=True, text=True)
    if proc.returncode != 0:
        return False, f"building the HIP samples failed:\n{proc.stdout}{proc.stderr}"
    return True, ""


def hip_samples() -> Path:
    ok, why = _build()
    if not ok:
        if why.startswith("building"):
            pytest.fail(why)
        pytest.skip(why)
    return HIP_SAMPLES
