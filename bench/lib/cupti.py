"""Which kernels a GPU process ran, from the driver (CUPTI activity records), not from the shim's
own counters: kernel_trace.c (beside this file), built against the nvidia-cuda-cupti wheel (a
test dependency) and injected with CUDA_INJECTION64_PATH. The GPU tests' evidence, and the
benchmarks' (bench/proteus_compare.py, the corpus runners' --kernel-trace-lib)."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUDA = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))  # cupti.h includes its cuda.h
VARIANT_MARK = "$proteus$"  # what a specialized variant's name carries (jit/ir.py variant_name)


@lru_cache(maxsize=None)
def _cupti_dirs() -> tuple[Path, Path]:
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        for sub in ("cu13", "cuda_cupti", "cu12"):
            include, lib = root / sub / "include", root / sub / "lib"
            if (include / "cupti.h").is_file() and any(lib.glob("libcupti.so*")):
                return include, lib
    raise RuntimeError("the nvidia-cuda-cupti wheel is not installed (it is a test dependency: make venv)")


@lru_cache(maxsize=None)
def injection_library(build_dir: str) -> Path:
    include, lib = _cupti_dirs()
    cupti = sorted(lib.glob("libcupti.so*"))[0]
    out = Path(build_dir) / "libkernel_trace.so"
    # cupti.h includes cuda.h, which the wheel leaves to the toolkit the samples build against
    cmd = ["cc", "-std=gnu11", "-O2", "-Wall", "-shared", "-fPIC", f"-I{include}", f"-I{CUDA / 'include'}",
           str(HERE / "kernel_trace.c"), "-o", str(out), str(cupti), f"-Wl,-rpath,{lib}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"building {out.name} failed:\n{done.stderr}")
    return out


def trace_env(build_dir: str | os.PathLike, trace_file: str | os.PathLike) -> dict[str, str]:
    """Environment entries that make a CUDA process write the names of the kernels it ran."""
    return {"CUDA_INJECTION64_PATH": str(injection_library(str(build_dir))), "CUPTI_KERNEL_TRACE_FILE": str(trace_file)}


TOOL_KERNELS = ("proteus_differs",)


def kernels_run(trace_file: str | os.PathLike) -> list[str]:
    lines = Path(trace_file).read_text().splitlines()
    if any(line.startswith("#error") for line in lines):
        raise RuntimeError(f"{trace_file}: {lines}")
    # the shim's own compare kernel (PROTEUS_VALIDATE's check) is not the app's
    return [name for name in (line.split("\t", 1)[0] for line in lines) if name not in TOOL_KERNELS]


def kernel_times(trace_file: str | os.PathLike) -> list[tuple[str, int]]:
    """(name, GPU nanoseconds) of every kernel run, from a trace written with
    CUPTI_KERNEL_TRACE_TIMES=1."""
    out = []
    for line in Path(trace_file).read_text().splitlines():
        name, sep, ns = line.rpartition("\t")
        if line.startswith("#error") or not sep or not ns.isdigit():
            raise RuntimeError(f"{trace_file}: not a timed trace: {line[:200]!r}")
        out.append((name, int(ns)))
    return out


def variants(names: list[str]) -> list[str]:
    return [n for n in names if VARIANT_MARK in n]


def originals(names: list[str]) -> list[str]:
    return [n for n in names if VARIANT_MARK not in n]
