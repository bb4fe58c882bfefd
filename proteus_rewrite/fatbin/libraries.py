"""The shared libraries a host ELF loads, found as the dynamic loader finds them, and which of
them carry GPU code.

Real applications keep their kernels in shared libraries (libggml-cuda.so, libtorch_cuda.so),
so recording only the executable would miss them. Only section headers and the dynamic table
are read, through a memory map: a dependency closure holds hundreds of megabytes of vendor
libraries whose bytes never need to be touched.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError
from . import elf64
from .hostelf import CUDA_FATBIN, CUDA_RELFATBIN, HIP_FATBIN

SHT_DYNAMIC = 6
DT_NEEDED, DT_RPATH, DT_RUNPATH = 1, 15, 29

# Where glibc looks last on x86-64 Debian/RHEL-likes, after LD_LIBRARY_PATH, RUNPATH and ld.so.cache.
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")

# Vendor libraries are built by nvcc or hipcc and never carry LLVM bitcode; reading the
# fat binaries of libcublas alone costs seconds, for nothing to record. The C and C++ run-time
# libraries hold no GPU code; not following them keeps the walk short.
VENDOR = re.compile(
    r"^lib(cudart|cuda|cublas(Lt)?|cufftw?|curand|cusparse(Lt)?|cusolver(Mg)?|cudnn\w*|cupti|cutensor\w*|cufile\w*"
    r"|nvrtc\w*|nvJitLink|nvjpeg|nvToolsExt|nvidia-\w+|nvblas|npp\w*|nccl|nvshmem\w*"
    r"|amdhip64|hiprtc|hipblas\w*|hipfft|hiprand|hipsparse|hipsolver|rocblas|rocfft|rocrand|rocsparse|rocsolver|MIOpen|rccl"
    r"|c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so")


@dataclass(frozen=True)
class Library:
    name: str  # as DT_NEEDED names it, or the path given
    path: str | None  # where the loader would find it (None: not found)
    gpu: bool  # holds a CUDA or HIP fat binary section
    vendor: bool  # a vendor library (see VENDOR): not read further


@dataclass(frozen=True)
class _Dynamic:
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    gpu: bool


def _read(path: str) -> _Dynamic:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 64:
            raise FormatError("too small to be an ELF file", path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                headers = elf64.sections(data)
                names = [elf64.section_name(data, headers, h) for h in headers]
            except (struct.error, ValueError, IndexError) as exc:
                raise FormatError(f"corrupt ELF section table ({exc})", path) from None
            gpu = any(n in (CUDA_FATBIN, CUDA_RELFATBIN, HIP_FATBIN) for n in names)
            needed, rpath, runpath = [], [], []
            dyn = next((h for h in headers if h[1] == SHT_DYNAMIC), None)
            if dyn is not None and dyn[6] < len(headers):
                strtab, raw = elf64.body(data, headers[dyn[6]]), elf64.body(data, dyn)
                for i in range(0, len(raw) - 15, 16):
                    tag, val = struct.unpack_from("<qQ", raw, i)
                    if tag == 0:
                        break
                    if tag in (DT_NEEDED, DT_RPATH, DT_RUNPATH) and val < len(strtab):
                        text = elf64.cstr(strtab, val)
                        if tag == DT_NEEDED:
                            needed.append(text)
                        else:
                            (rpath if tag == DT_RPATH else runpath).extend(p for p in text.split(":") if p)
    return _Dynamic(tuple(needed), tuple(rpath), tuple(runpath), gpu)


def _expand(entry: str, origin: str) -> str:
    for token in ("$ORIGIN", "${ORIGIN}"):
        entry = entry.replace(token, origin)
    for token in ("$LIB", "${LIB}"):
        entry = entry.replace(token, "lib64")
    for token in ("$PLATFORM", "${PLATFORM}"):
        entry = entry.replace(token, "x86_64")
    return entry


_ldcache: dict[str, str] | None = None


def _ld_so_cache() -> dict[str, str]:
    """soname -> path from `ldconfig -p` (the loader's cache), x86-64 entries only."""
    global _ldcache
    if _ldcache is None:
        _ldcache = {}
        for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
            try:
                out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in out.splitlines():
                m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
                if m and "x86-64" in m.group(2):
                    _ldcache.setdefault(m.group(1), m.group(3))
            break
    return _ldcache


def _find(name: str, loader_rpath: list[str], runpath: tuple[str, ...], origin: str) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) else None
    # glibc's order: DT_RPATH (of the object and the executable) unless a DT_RUNPATH is present,
    # LD_LIBRARY_PATH, DT_RUNPATH, the cache, the default directories.
    dirs = [] if runpath else list(loader_rpath)
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [_expand(d, origin) for d in runpath]
    for d in dirs:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate):
            return candidate
    cached = _ld_so_cache().get(name)
    if cached and os.path.isfile(cached):
        return cached
    for d in DEFAULT_DIRS:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def needed(path: str | os.PathLike) -> list[Library]:
    """Every shared library `path` loads, directly or through others, in breadth-first order,
    as the loader would find it from here (LD_LIBRARY_PATH as now). Vendor libraries are
    listed, not followed."""
    root = os.path.abspath(os.fspath(path))
    top = _read(root)
    exe_rpath = [_expand(d, os.path.dirname(root)) for d in top.rpath]
    out: list[Library] = []
    seen: set[str] = set()
    queue: list[tuple[str, _Dynamic, list[str]]] = [(root, top, exe_rpath)]
    while queue:
        obj, dyn, inherited = queue.pop(0)
        origin = os.path.dirname(obj)
        rpath = [_expand(d, origin) for d in dyn.rpath] + inherited
        for name in dyn.needed:
            if name in seen:
                continue
            seen.add(name)
            found = _find(name, rpath, dyn.runpath, origin)
            vendor = bool(VENDOR.match(os.path.basename(name)))
            if found is None:
                out.append(Library(name, None, False, vendor))
                continue
            real = os.path.realpath(found)
            if vendor:
                out.append(Library(name, found, False, True))
                continue
            try:
                lib = _read(real)
            except (OSError, FormatError):
                out.append(Library(name, found, False, False))
                continue
            out.append(Library(name, found, lib.gpu, False))
            queue.append((real, lib, rpath if not dyn.runpath else []))
    return out


def with_gpu_code(path: str | os.PathLike) -> list[Library]:
    """The libraries of needed(path) that hold GPU code and may carry bitcode."""
    return [lib for lib in needed(path) if lib.gpu]


def is_python_extension(path: str | os.PathLike) -> bool:
    """A CPython extension module (`foo.cpython-312-x86_64-linux-gnu.so`, `foo.abi3.so`): it is
    loaded by python, so the shim must be preloaded into python."""
    name = Path(path).name
    return bool(re.search(r"\.(cpython-[^.]+|abi3|pypy[^.]*)\.so$", name))
