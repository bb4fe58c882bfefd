"""bench/upstream_tests' scripts, loaded for the unit tests of run.py, checks.py, build.py and
upstream.py (tests/unit/test_upstream_*.py), and what those tests share: a CHECK directive as
programs.json holds it, and fake programs written as executables."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from .scripts import ROOT, load_script

UPSTREAM_TESTS = ROOT / "bench" / "upstream_tests"


def _load(name: str):
    return load_script(UPSTREAM_TESTS / f"{name}.py", f"upstream_tests_{name}")


run = _load("run")
build = _load("build")
checks = sys.modules["checks"]  # run.py imported it from beside itself
upstream = sys.modules["upstream"]  # build.py imported it from beside itself


def chk(pattern: str, directive: str = "CHECK", count: int = 1, prefix: str = "CHECK", line: int = 1) -> dict:
    return {"prefix": prefix, "directive": directive, "count": count, "pattern": pattern, "line": line}


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
