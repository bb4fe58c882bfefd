"""Shared fixtures: the sample apps (built once per session) and their kernel tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "build"


@pytest.fixture(scope="session")
def samples() -> Path:
    """samples/build/, built (or brought up to date) by samples/build.py. On a machine without
    clang (the GPU host) the samples built elsewhere and copied here are used as they are."""
    import shutil

    if shutil.which(os.environ.get("CLANG", "clang++-19")) is None and (SAMPLES / "loop_count").exists():
        return SAMPLES
    proc = subprocess.run([sys.executable, str(ROOT / "samples" / "build.py")], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"building the samples failed:\n{proc.stdout}{proc.stderr}")
    return SAMPLES


@pytest.fixture(scope="session")
def table(samples):
    """table(name) -> the KernelTable of samples/build/<name>, extracted once."""
    from proteus_rewrite.fatbin import extract

    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = extract(samples / name)
        return cache[name]

    return get


def run_cli(*args: str, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess: exit codes and stderr as a user sees them."""
    code = "import sys; from proteus_rewrite.cli import run; sys.argv[0] = 'proteus-rewrite'; run()"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PROTEUS_DEBUG", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env)


def pytest_collection_modifyitems(config, items):
    from proteus_rewrite import gpu

    status = None
    for item in items:
        if "gpu" in item.keywords:
            status = status or gpu.status()
            if not status.available:
                item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU: {status.reason}"))
