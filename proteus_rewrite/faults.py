"""Fault injection for tests: PROTEUS_FAULT_INJECT=point[,point...] makes the named step of
the run-time path fail, to prove that every failure ends in the original kernel running,
one warning, and unchanged output. Points:

    specialize      the specializer raises an unexpected exception
    optimize        the optimization pipeline fails
    ptx             PTX generation fails
    cubin           the PTX compiler (nvJitLink / ptxas) fails
    codeobj         AMDGPU code generation fails (HIP)
    module-load     the driver refuses the specialized image (checked in the C shim)
    compiler-crash  the compiler process dies (SIGKILL) on a compilation (jit/process.py)
    wrong-code      a variant computes a different result: its last folded integer is one
                    larger (jit/ir.py), for PROTEUS_VALIDATE's tests
    slow-code       a variant spins about 0.1 ms per thread before its work (jit/ir.py), for
                    the speed trials' tests (PROTEUS_SPEED_CHECK)
    cache-unwritable, cache-full, cache-readonly
                    writing a disk cache entry fails with EACCES, ENOSPC or EROFS

Not for production use: it exists so that tests can reach paths real failures take.
"""

from __future__ import annotations

import errno
import os

from .errors import SpecializeError

CACHE_ERRORS = {"cache-unwritable": errno.EACCES, "cache-full": errno.ENOSPC, "cache-readonly": errno.EROFS}


def active(point: str) -> bool:
    return point in {p.strip() for p in os.environ.get("PROTEUS_FAULT_INJECT", "").split(",")}


def check(point: str) -> None:
    """Raise the injected failure of `point`, if asked for."""
    if active(point):
        if point == "specialize":
            raise RuntimeError("injected fault: specializer exception")
        raise SpecializeError(f"injected fault: {point} failed")


def check_cache_write() -> None:
    for point, code in CACHE_ERRORS.items():
        if active(point):
            raise OSError(code, os.strerror(code) + " (injected)")
