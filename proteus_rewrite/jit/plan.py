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
