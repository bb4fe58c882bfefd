"""What the CUDA and HIP roads to a kernel table share (kernels.py and hip.py): reading the
embedded bitcode in a child process, merging a kernel's parameter layout (device code) with
its LLVM types (bitcode), the app's own record, and demangling."""

from __future__ import annotations

import hashlib
import os

import cxxfilt

from ..errors import BitcodeError, ProteusError
from . import bitcode as bitcode_mod
from . import hostelf
from .table import AppInfo, ParamRecord


def analyze_isolated(bitcodes: list[bytes]) -> list[bitcode_mod.BitcodeModule]:
    """Read the bitcode modules in a forked child process. LLVM (llvmlite's build keeps its
    assertions) aborts the whole process on some malformed bitcode: in a child, that is one
    BitcodeError naming the module instead of a crash."""
    if not bitcodes:
        return []
    result = _in_child(bitcodes)
    if result is not None:
        return result
    for i, bc in enumerate(bitcodes):  # find the module that brought LLVM down
        if _in_child([bc]) is None:
            raise BitcodeError(f"LLVM crashed reading embedded bitcode module {i} (corrupt bitcode)")
    raise BitcodeError("LLVM crashed reading the embedded bitcode (corrupt bitcode)")


def _in_child(bitcodes: list[bytes]):
    """analyze() in a fork; None if the child died. ProteusErrors come back and are raised here.
    (The result travels as a pickle from our own child, never from a file.)"""
    import pickle

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: analyze, send, and leave without running any cleanup of the parent's
        os.close(rfd)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # an LLVM assertion's text must not reach the user
        try:
            try:
                payload = pickle.dumps(("ok", [bitcode_mod.analyze(bc) for bc in bitcodes]))
            except ProteusError as exc:
                payload = pickle.dumps(("error", exc))
            with os.fdopen(wfd, "wb") as w:
                w.write(payload)
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not data:
        return None
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value


def hostelf_app_info(path: str, data: bytes, elf: hostelf.HostElf) -> AppInfo:
    return AppInfo(
        name=os.path.basename(path),
        path=os.path.abspath(path),
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        file_type=elf.file_type,
        pie=elf.is_pie,
        stripped=elf.stripped,
        cudart=elf.cudart,
        rdc=hostelf.CUDA_RELFATBIN in elf.sections,
        rewritten=rewrite_record(elf),
    )


def rewrite_record(elf: hostelf.HostElf) -> dict | None:
    import json

    sec = elf.sections.get(hostelf.MARKER_SECTION)
    if sec is None:
        return None
    try:
        return json.loads(sec.data.rstrip(b"\0"))
    except ValueError:
        return {"tool": "unknown (unreadable .proteus_rewrite section)"}


def merge_params(name: str, layout, bk: bitcode_mod.BitcodeKernel | None, warnings: list[str]) -> tuple[ParamRecord, ...]:
    if bk is not None and len(bk.params) != len(layout):
        warnings.append(
            f"{demangle(name)}: bitcode has {len(bk.params)} parameters, device code {len(layout)}; "
            "its parameters will not be specialized"
        )
        bk = None
    out = []
    for i, lp in enumerate(layout):
        bp = bk.params[i] if bk else None
        kind = bp.kind if bp else "unknown"
        if bp and bp.size is not None and bp.size != lp.size:
            warnings.append(
                f"{demangle(name)}: parameter {i} is {bp.size} bytes in bitcode ({bp.llvm_type}) but {lp.size} "
                "in device code; it will not be specialized"
            )
            kind = "unknown"
        align = (bp.align if bp and bp.align else None) or natural_align(lp.offset, lp.size)
        out.append(ParamRecord(i, kind, bp.llvm_type if bp else None, lp.size, lp.offset, align, bp.byval if bp else False))
    return tuple(out)


def natural_align(offset: int, size: int) -> int:
    align = 1
    while align < 8 and align * 2 <= size and offset % (align * 2) == 0:
        align *= 2
    return align


def params_end(params: tuple[ParamRecord, ...]) -> int:
    return max((p.offset + p.size for p in params), default=0)


def demangle(name: str) -> str:
    try:
        return cxxfilt.demangle(name)
    except cxxfilt.InvalidName:
        return name
