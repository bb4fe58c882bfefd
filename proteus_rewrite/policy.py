"""Which arguments to fold, per kernel, for binaries nobody annotated.

Folding every scalar is right for hyper-parameters that never change and ruinous for a step
counter: every launch would compile a variant. Two guards, both per kernel:

Value tracker (the specialization tracker of the LLVM OpenMP offload JIT paper): N counts the
distinct variants this process has asked for, n_i the distinct values slot i (an argument,
the block or the grid) had among them. Before a new variant, every slot with N > T and
n_i / N > R stops being folded: from then on its value is a run-time parameter and one
variant serves all its values. Annotated arguments (annotate("jit", ...)) are never dropped.

Compile budget: a kernel may spend max(grace, fraction x its GPU time) milliseconds on
compilation; past that, launches that would need a new variant run the original kernel
(variants already made, and cache hits, are still used). The GPU time is estimated by the
shim from events sampled on a few launches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BLOCK, GRID = "block", "grid"


@dataclass
class Tracker:
    threshold: int  # T
    ratio: float  # R
    folded: set[int]  # argument slots folded now
    dims: int  # bit 0: block in the key (folded / launch bounds), bit 1: grid
    fixed: frozenset[int] = frozenset()  # annotated arguments: never dropped
    variants: int = 0  # N
    values: dict[object, set[bytes]] = field(default_factory=dict)  # slot -> distinct values seen
    keys: set[bytes] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)  # in order, for the report

    def slots(self) -> list[object]:
        return [*sorted(self.folded), *([BLOCK] if self.dims & 1 else []), *([GRID] if self.dims & 2 else [])]

    def before(self, values: dict[object, bytes]) -> None:
        """Called before a new variant with the launch's value for every slot."""
        key = b"\0".join(bytes(str(s), "ascii") + b"=" + values[s] for s in self.slots())
        if key in self.keys:  # asked for before (another context, a policy change): not new
            return
        if self.variants > self.threshold:
            for slot in self.slots():
                if slot in self.fixed:
                    continue
                if len(self.values.get(slot, ())) / self.variants > self.ratio:
                    self._drop(slot)
        self.variants += 1
        kept = self.slots()
        self.keys.add(b"\0".join(bytes(str(s), "ascii") + b"=" + values[s] for s in kept))
        for slot in kept:
            self.values.setdefault(slot, set()).add(values[slot])

    def _drop(self, slot: object) -> None:
        if slot == BLOCK:
            self.dims &= ~1
        elif slot == GRID:
            self.dims &= ~2
        else:
            self.folded.discard(slot)
        self.dropped.append(str(slot))


@dataclass
class Budget:
    fraction: float
    grace_ms: float

    def allows(self, compile_ms: float, gpu_ms: float) -> bool:
        return compile_ms < max(self.grace_ms, self.fraction * gpu_ms)
