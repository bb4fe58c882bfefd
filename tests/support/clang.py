"""Building CUDA programs for tests with clang-19, the way samples/build.py builds the samples
(its CUDA 13 compatibility tree, either recipe)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from samples import build as sb

ROOT = Path(__file__).resolve().parents[2]
CLANG = os.environ.get("CLANG", "clang++-19")
CUDA = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))


def need_clang() -> None:
    if shutil.which(CLANG) is None or not (CUDA / "bin" / "nvcc").exists():
        pytest.skip(f"needs {CLANG} and the CUDA toolkit to build CUDA programs (not on the GPU host)")


def build_cuda(sources: list[Path], exe: Path, recipe: str = "recommended", flags: tuple[str, ...] = (),
               includes: tuple[Path, ...] = ()) -> Path:
    """clang++ -x cuda for sm_90 with the recipe's bitcode flags (samples/build.py RECIPES), static cudart."""
    need_clang()
    tree, stubs = sb.make_compat_tree(ROOT / "samples" / "build", CUDA)
    cmd = [CLANG, "-x", "cuda", "--cuda-gpu-arch=sm_90", f"--cuda-path={tree}", "-I", str(stubs),
           "-I", str(CUDA / "include" / "cccl"), *[f"-I{p}" for p in includes], "-O3", "-std=c++17",
           "-Wno-unknown-cuda-version", *sb.RECIPES[recipe], *flags, *map(str, sources),
           "-L", str(CUDA / "lib64"), "-lcudart_static", "-ldl", "-lrt", "-lpthread", "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"build failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return exe
