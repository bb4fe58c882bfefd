"""What the corpus runners share (bench/corpora/cuda_samples, hecbench and upstream_tests run.py):
running a program natively and under the tool, the tool's modes, reading what the shim's report
and the CUPTI trace say a run did, and writing the results.

Standard library only (Python 3.10+): the corpus tarballs carry this file (as bench/lib/harness.py,
beside bench/__init__.py and bench/lib/__init__.py) to GPU hosts that have nothing but Python."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# The tool's modes as cuda_samples and hecbench run them (upstream_tests has modes of its own).
MODES = ("sync-cold", "default-cold", "default-warm")
VARIANT_MARK = "$proteus$"  # in the name of every specialized variant (proteus_rewrite/jit/ir.py)
# What makes a run one of the tool's or a traced one: never inherited from the caller, so that a
# native run is native and a run is traced only where the runner asks.
TOOL_VARS = ("LD_PRELOAD", "CUDA_INJECTION64_PATH", "CUPTI_KERNEL_TRACE_FILE", "CUPTI_KERNEL_TRACE_TIMES")
# Runners that run programs in parallel write their log and results under it.
LOCK = threading.Lock()


def log(msg: str) -> None:
    with LOCK:
        print(msg, file=sys.stderr, flush=True)


# --- running one command --------------------------------------------------------------------

def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without the tool's and the tracer's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTEUS_") and k not in TOOL_VARS}
    env.update(extra or {})
    return env


def execute(cmd: list[str], cwd: Path, env_extra: dict[str, str], timeout: float) -> dict:
    """Run one command in its own process group (a timeout kills all of it: a child left holding
    the pipes would otherwise hang the runner too): rc (an int, "timeout" or "oserror"),
    seconds, and all of stdout and stderr."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=clean_env(env_extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:  # not executable, missing: the record says so, the run goes on
        return {"rc": "oserror", "seconds": 0.0, "stdout": "", "stderr": str(exc)}
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        rc = "timeout"
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 2),
            "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}


def run_cmd(cmd: list[str], cwd: Path, env_extra: dict[str, str], timeout: float, dry_run: bool = False) -> dict:
    """One command's record: the command, its folder and environment additions, return code,
    seconds, all of stdout (for comparison) and the end of stderr. With `dry_run`, the command
    printed as a shell line instead of run."""
    record = {"cmd": shlex.join(cmd), "cwd": str(cwd), "env": env_extra}
    if dry_run:
        env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_extra.items())
        with LOCK:
            print(f"(cd {shlex.quote(str(cwd))} && {env_text + ' ' if env_text else ''}{shlex.join(cmd)})", flush=True)
        return {**record, "rc": 0, "seconds": 0.0, "stdout": "", "stderr_tail": "", "dry_run": True}
    done = execute(cmd, cwd, env_extra, timeout)
    return {**record, "rc": done["rc"], "seconds": done["seconds"], "stdout": done["stdout"],
            "stderr_tail": done["stderr"][-2000:]}


def first_line(cmd: list[str], timeout: float = 30) -> str:
    """The first line a command prints ("" where it cannot run): versions, the GPU's name."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (proc.stdout.strip().splitlines() or [""])[0]


def gpu_name(nvidia_smi: str, timeout: float = 30) -> str:
    return first_line([nvidia_smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout)


# --- the tool -------------------------------------------------------------------------------

def default_tool() -> list[str]:
    """proteus-rewrite on PATH, else next to this Python (a venv's bin/), else as a module."""
    found = shutil.which("proteus-rewrite")
    if found:
        return [found]
    beside = Path(sys.executable).parent / "proteus-rewrite"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "proteus_rewrite.cli"]


def tool_command(spec: str | None) -> list[str]:
    """--tool's command line, or default_tool(); a path made absolute, since the tool runs in each
    program's folder, where a relative one would not resolve."""
    tool = shlex.split(spec) if spec else default_tool()
    if "/" in tool[0]:
        tool[0] = str(Path(tool[0]).resolve())
    return tool


def mode_env(mode: str, scratch: Path, report: Path) -> dict[str, str]:
    """The environment additions of a run in one of MODES: sync-cold in a cache of its own
    (scratch/cache-sync), default-cold filling scratch/cache and default-warm reading it back."""
    env = {"PROTEUS_CACHE_DIR": str(scratch / ("cache-sync" if mode == "sync-cold" else "cache")),
           "PROTEUS_REPORT": str(report)}
    if mode == "sync-cold":
        env["PROTEUS_ASYNC_COMPILATION"] = "0"
    return env


# --- what a run did -------------------------------------------------------------------------

def traced(env: dict[str, str], trace_lib: str | None, trace: Path, dry_run: bool = False) -> dict[str, str]:
    """`env` plus what makes the CUPTI injection library (bench/lib/kernel_trace.c) write the
    kernels the GPU ran to `trace`; a stale trace removed first, so that it cannot pass for this
    run's. `env` itself where there is no library."""
    if not trace_lib:
        return env
    if not dry_run:
        trace.unlink(missing_ok=True)
    return {**env, "CUDA_INJECTION64_PATH": trace_lib, "CUPTI_KERNEL_TRACE_FILE": str(trace)}


def trace_counts(trace: Path) -> dict | None:
    """From a kernel trace (a kernel's name a line, a tab and nanoseconds after it where timed):
    the launches the GPU ran, those that ran a variant and those that ran an original, and the
    trace's error lines; None where there is none (the library did not load, or the process died)."""
    try:
        lines = trace.read_text(errors="replace").splitlines()
    except OSError:
        return None
    names = [line.split("\t", 1)[0] for line in lines if line and not line.startswith("#")]
    names = [n for n in names if n != "proteus_differs"]  # the shim's own compare kernel (its check) is not the app's
    variants = sum(VARIANT_MARK in n for n in names)
    return {"launches": len(names), "variants": variants, "originals": len(names) - variants,
            "errors": [line for line in lines if line.startswith("#error")]}


def report_share(report: dict) -> dict:
    """From a PROTEUS_REPORT (runtime.write_report): launches, specialized launches, their
    share, fallbacks, and the failures summed over kernels by reason."""
    launches = specialized = fallbacks = 0
    failures: dict[str, int] = {}
    for k in report.get("kernels", []):
        launches += int(k.get("launches", 0))
        specialized += int(k.get("specialized_launches", 0))
        fallbacks += int(k.get("fallback_launches", 0))
        for reason, count in (k.get("failures") or {}).items():
            failures[reason] = failures.get(reason, 0) + int(count)
    return {"launches": launches, "specialized_launches": specialized, "fallback_launches": fallbacks,
            "share": round(specialized / launches, 4) if launches else None, "failures": failures,
            "kernels": len(report.get("kernels", [])),
            "unknown_handle_launches": report.get("unknown_handle_launches", 0)}


def read_report(path: Path, keys: tuple[str, ...] | None = None) -> dict | None:
    """report_share of the PROTEUS_REPORT at `path` (only `keys` of it, where given); None
    where there is none: the shim did not load or the process died before exit."""
    try:
        share = report_share(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    return share if keys is None else {k: share[k] for k in keys}


# --- results --------------------------------------------------------------------------------

def load_manifest(work: Path, default: dict | None = None) -> dict:
    """The builder's work/manifest.json, or `default` where nothing was built there."""
    path = work / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else dict(default or {})


def write_files(out: Path, files: dict[str, str]) -> None:
    """Write each file whole or not at all: the runners rewrite their results after every program,
    and a run cut short must not leave a half-written one."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
