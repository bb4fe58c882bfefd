"""How many blocks of a kernel fit on one SM, from its registers per thread, and the register
budget that keeps a variant at least as resident as the AOT code it replaces.

A variant is capped (nvvm.maxnreg) so that it never loses occupancy against the AOT code: LLVM
22's code can need more registers than clang 19's for the same source. Capping it at the AOT
code's exact count was stricter than that: HeCBench sw4ck's kernel4 (AOT 168 registers, 256
threads) fits one block per SM anywhere from 129 to 255 registers, yet its variant was held to
168 and spilled 56 bytes a thread. The cap here is the largest count with the AOT code's
blocks per SM, so a variant spills only where it would otherwise lose residency.

The limits are those of CUDA's occupancy calculator (programming guide, "Technical
Specifications per Compute Capability"); shared memory is left out (a variant uses what the
AOT code uses, so it cannot change the answer by itself)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

REGISTERS_PER_SM = 65536
MAX_REGISTERS_PER_THREAD = 255
REGISTER_ALLOCATION_UNIT = 256  # per warp
WARP = 32


@dataclass(frozen=True)
class SmLimits:
    warps: int  # resident warps per SM
    blocks: int  # resident blocks per SM


# compute capability -> limits; an architecture not listed gets no budget (the AOT count stays the cap)
LIMITS = {
    50: SmLimits(64, 32), 52: SmLimits(64, 32), 53: SmLimits(64, 32),
    60: SmLimits(64, 32), 61: SmLimits(64, 32), 62: SmLimits(64, 32),
    70: SmLimits(64, 32), 72: SmLimits(64, 32), 75: SmLimits(32, 16),
    80: SmLimits(64, 32), 86: SmLimits(48, 16), 87: SmLimits(48, 16), 89: SmLimits(48, 24),
    90: SmLimits(64, 32), 100: SmLimits(64, 32), 103: SmLimits(64, 32), 120: SmLimits(48, 24),
}


def blocks_per_sm(registers: int, threads: int, arch: int) -> int | None:
    """Resident blocks of `threads` threads at `registers` per thread (None: unknown arch)."""
    limits = LIMITS.get(arch)
    if limits is None or threads <= 0 or registers <= 0:
        return None
    warps = -(-threads // WARP)
    per_warp = -(-registers * WARP // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    by_registers = (REGISTERS_PER_SM // per_warp) // warps
    return min(by_registers, limits.warps // warps, limits.blocks)


@functools.lru_cache(maxsize=1024)
def register_budget_for(blocks: int, threads: int, arch: int) -> int | None:
    """The most registers per thread at which `blocks` blocks fit on an SM (None: never)."""
    for registers in range(MAX_REGISTERS_PER_THREAD, 0, -1):
        fits = blocks_per_sm(registers, threads, arch)
        if fits is None:
            return None
        if fits >= blocks:
            return registers
    return None


@functools.lru_cache(maxsize=1024)  # every miss asks (make_plan, on the launching thread): up to 70 us uncached
def register_budget(aot_registers: int, threads: int, arch: int) -> int:
    """The most registers per thread a variant may use and still fit as many blocks per SM as
    the AOT code does; the AOT count itself where the architecture is unknown."""
    target = blocks_per_sm(aot_registers, threads, arch)
    if not target:
        return aot_registers
    # counts are allocated in units of 8 per thread: try each unit from the top down
    for registers in range(MAX_REGISTERS_PER_THREAD, aot_registers, -1):
        if (blocks_per_sm(registers, threads, arch) or 0) >= target:
            return registers
    return aot_registers
