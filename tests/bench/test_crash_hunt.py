"""bench/crash_hunt.py: many cold runs under the tool, what the failed ones printed, and the
AddressSanitizer build of the shim it preloads with --asan (CPU: the app is a shell script)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import crash_hunt
from proteus_rewrite.inject import shim

from ..conftest import ROOT

APP = """#!/bin/sh
# a fake program: its fourth cold run dies as glibc does on a damaged heap
echo "result 42"
case "$PROTEUS_CACHE_DIR" in *cache-3) echo "free(): invalid pointer" >&2; kill -ABRT $$;; esac
"""


def _tool_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tool"
    d.mkdir()
    shutil.copy2(shim.packaged_shim(), d / "libproteus.so")
    return d


def _app(tmp_path: Path) -> Path:
    app = tmp_path / "app.sh"
    app.write_text(APP)
    app.chmod(0o755)
    return app


def _hunt(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.crash_hunt", "--tool-dir", str(tmp_path / "tool"), "--runs", "5",
                           "--jobs", "2", "--out", str(out), *extra, "--", str(tmp_path / "app.sh")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    doc = json.loads((out / "crash-hunt.json").read_text()) if (out / "crash-hunt.json").exists() else {}
    md = (out / "crash-hunt.md").read_text() if (out / "crash-hunt.md").exists() else ""
    return proc, doc, md


def test_each_run_is_cold_and_a_crash_keeps_its_message(tmp_path):
    _tool_dir(tmp_path)
    _app(tmp_path)
    proc, doc, md = _hunt(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["rc"] for r in doc["runs"]] == [0, 0, 0, -6, 0]
    assert "free(): invalid pointer" in doc["runs"][3]["stderr_tail"]
    assert "5 cold runs, 1 failed; exit codes: -6: 1, 0: 4" in md
    assert "| free(): invalid pointer | 1 |" in md


def test_asan_builds_a_sanitized_shim_and_preloads_its_runtime_first(tmp_path):
    cc = shutil.which("cc") or "cc"
    if not crash_hunt.asan_runtime(cc):
        pytest.skip(f"{cc} has no libasan.so")
    tool = _tool_dir(tmp_path)
    original = (tool / "libproteus.so").read_bytes()
    _app(tmp_path)
    proc, doc, _md = _hunt(tmp_path, "--asan")
    assert proc.returncode == 0, proc.stderr
    assert (tool / "libproteus.so.orig").read_bytes() == original
    symbols = subprocess.run(["nm", "-D", str(tool / "libproteus.so")], capture_output=True, text=True).stdout
    assert "__asan_" in symbols
    assert [r["rc"] for r in doc["runs"]] == [0, 0, 0, -6, 0]  # the app runs under the sanitized shim
    assert doc["header"]["asan"] is True


def test_a_tool_dir_without_the_shim_is_one_line(tmp_path):
    (tmp_path / "tool").mkdir()
    _app(tmp_path)
    proc, _doc, _md = _hunt(tmp_path)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0
    assert "libproteus.so: not found" in proc.stderr


@pytest.mark.parametrize("stderr,line", [
    ("x\n==1==ERROR: AddressSanitizer: heap-use-after-free on address\nSUMMARY: AddressSanitizer: heap-use-after-free a.c:3",
     "SUMMARY: AddressSanitizer: heap-use-after-free a.c:3"),
    ("malloc_consolidate(): invalid chunk size\n", "malloc_consolidate(): invalid chunk size"),
    ("", "(no stderr)"),
])
def test_the_first_error_line(stderr, line):
    assert crash_hunt.first_error(stderr) == line
