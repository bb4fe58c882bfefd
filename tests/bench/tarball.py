"""Running a corpus runner as a GPU host does: from the top of its unpacked tarball, with
`python3 -S -m bench.corpora.NAME.run` (no site-packages: the standard library only), without
PYTHONPATH or this repository on the path."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path


def unpack(tarball: Path, dest: Path) -> tuple[set[str], Path]:
    """The tarball's member names, and the folder it was unpacked into."""
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        tar.extractall(dest, filter="data")
    return names, dest


def run_module(top: Path, module: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-S", "-m", module, *args], cwd=top, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
