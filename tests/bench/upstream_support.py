"""What the tests of bench/corpora/upstream_tests (test_upstream_*.py) share: its modules, a
CHECK directive as programs.json holds it, and fake programs written as executables."""

from __future__ import annotations

import stat
from pathlib import Path

from bench.corpora.upstream_tests import build, checks, run, upstream

__all__ = ["build", "checks", "chk", "executable", "run", "upstream"]


def chk(pattern: str, directive: str = "CHECK", count: int = 1, prefix: str = "CHECK", line: int = 1) -> dict:
    return {"prefix": prefix, "directive": directive, "count": count, "pattern": pattern, "line": line}


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
