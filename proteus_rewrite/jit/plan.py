"""What to specialize for one launch, decided before anything is compiled."""

from __future__ import annotations

from dataclasses import dataclass, field

from .launch import Dim3


@dataclass(frozen=True)
class Plan:
    """What to specialize, decided before any compilation (it is also the cache key's content)."""

    folded: dict[int, str]  # parameter index -> IR constant text
    block: Dim3 | None  # None: not known to the code (the variant serves any block size)
    grid: Dim3 | None
    fold_dims: bool
    dims_range: bool
    max_threads: Dim3 | None  # "nvvm.maxntid" for the new kernel, None to leave launch bounds alone
    min_ctas: int | None
    alignment: dict[int, int] = field(default_factory=dict)  # pointer parameter -> known alignment
    globals: dict[str, int] = field(default_factory=dict)  # device variable -> AOT address
    relink_globals: bool = True  # False only for inspection without a GPU: the module keeps its own copies
    max_registers: int | None = None  # "nvvm.maxnreg": the AOT code's count, so occupancy never drops below it
    # The variant's entry point: the kernel's name plus "$proteus$" and its key's start, so that
    # profilers (Nsight, CUPTI) show which launches ran JIT code. Set once the key is known (the
    # key does not cover it); None: the kernel's own name (HIP keeps it).
    entry: str | None = None


VARIANT_MARK = "$proteus$"


def variant_name(kernel: str, key: str) -> str:
    return f"{kernel}{VARIANT_MARK}{key[:12]}"


@dataclass
class Findings:
    """What specializing a module found (ir.specialize_module): notes a user should read, and how
    many calls read each special register the launch folds (upstream's [DimSpec] lines count them)."""

    notes: list[str] = field(default_factory=list)
    sreg_calls: dict[str, int] = field(default_factory=dict)
