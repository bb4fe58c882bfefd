"""Where a benchmark result came from: the machine, GPU, driver, CUDA, LLVM and tool versions
and the commit (environment, git_commit), the GPU's short name for file names (gpu_tag), and the
header, arguments and file every CPU benchmark's results share (cpu_results, cpu_arguments,
write_cpu_results, publish_cpu_results)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from bench.lib.paths import APPS_BUILD, RESULTS, ROOT


def _cmd(args: list[str]) -> str | None:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=30)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit(short: bool = False) -> str | None:
    """GIT_COMMIT: set by whoever sends the tree to a machine whose copy of .git may be stale."""
    return os.environ.get("GIT_COMMIT") or _cmd(["git", "-C", str(ROOT), "rev-parse", *(["--short"] if short else []), "HEAD"])


def cpu_results(benchmark: str, module: str, argv: list[str] | None, **fields) -> dict:
    """The header of a CPU benchmark's results file: what ran (`module`: bench.micro.NAME),
    where and when."""
    return {"benchmark": benchmark, "date": datetime.date.today().isoformat(),
            "command": f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": git_commit(short=True), "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            **fields}


def write_cpu_results(doc: dict, out: str, prefix: str, tag: str) -> Path:
    """OUT/PREFIX-DATE-HOST[-TAG].json"""
    path = Path(out) / f"{prefix}-{doc['date']}-{platform.node() or 'host'}{'-' + tag if tag else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def cpu_arguments(ap) -> None:
    """--out and --tag, as every CPU benchmark takes them (write_cpu_results)."""
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--tag", default="", help="appended to the results' file name")


def publish_cpu_results(doc: dict, args, prefix: str, script: str, columns: list[str], rows: list[list]) -> Path:
    """Write a CPU benchmark's results (write_cpu_results), print them as a markdown table
    (the first column left-aligned) and say where they went."""
    path = write_cpu_results(doc, args.out, prefix, args.tag)
    print("| " + " | ".join(columns) + " |\n|---|" + "---:|" * (len(columns) - 1))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print(f"{script}: wrote {path}", file=sys.stderr)
    return path


def environment() -> dict:
    env: dict = {"python": sys.version.split()[0], "host": platform.node(), "kernel": platform.release()}
    try:
        env["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except Exception:
        env["cpu"] = None
    env["cpu_count"] = os.cpu_count()
    smi = _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,"
                "pci.bus_id,persistence_mode", "--format=csv,noheader"])
    env["nvidia_smi"] = smi
    env["gpu"] = smi.split(",")[0].strip() if smi else None
    env["driver"] = smi.split(",")[1].strip() if smi else None
    try:
        from cuda.bindings import driver as cu

        err, version = cu.cuDriverGetVersion()
        env["cuda_driver_api"] = f"{int(version) // 1000}.{int(version) % 1000 // 10}" if int(err) == 0 else None
        env["cuda_driver_api_int"] = int(version)
    except Exception as exc:
        env["cuda_driver_api"] = f"unavailable ({type(exc).__name__}: {exc})"
    nvcc = None
    for candidate in ("nvcc", os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", "nvcc")):
        nvcc = _cmd([candidate, "--version"])
        if nvcc:
            break
    env["cuda_toolkit"] = nvcc.splitlines()[-1] if nvcc else None
    try:
        import llvmlite
        import llvmlite.binding as llvm

        env["llvm"] = ".".join(map(str, llvm.llvm_version_info))
        env["llvmlite"] = llvmlite.__version__
    except Exception as exc:
        env["llvm"] = f"unavailable ({exc})"
    try:
        from proteus_rewrite import __version__

        env["proteus_rewrite"] = __version__
    except Exception:
        env["proteus_rewrite"] = None
    env["git_commit"] = git_commit()
    env["git_dirty"] = bool(_cmd(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]))
    clang = _cmd([os.environ.get("CLANG", "clang++-19"), "--version"])
    env["clang_here"] = clang.splitlines()[0] if clang else None
    comment = _cmd(["readelf", "-p", ".comment", str(APPS_BUILD / "adam")])
    env["apps_built_by"] = sorted({m.group(1).strip() for m in re.finditer(r"\]\s+(.*clang.*)", comment or "")}) or None
    return env


def gpu_tag(env: dict) -> str:
    name = (env.get("gpu") or "nogpu").lower()
    m = re.search(r"\b([a-z]+\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-")
