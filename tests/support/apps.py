"""Running a GPU test's app: its output, and no Python traceback in it from anything the shim
started (the compiler process writes to the app's stderr; an uncaught error there was missed
while tests read only checksums)."""

from __future__ import annotations

import os
import subprocess


def run_app(exe, args=(), env_extra=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=dict(os.environ, **(env_extra or {})),
                          timeout=300)
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr
    return proc
