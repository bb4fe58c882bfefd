"""Which arguments to fold, per kernel, for binaries nobody annotated.

Folding every scalar is right for hyper-parameters that never change and ruinous for a step
counter: every launch would compile a variant. Two guards, both per kernel:

Value tracker (the specialization tracker of the LLVM OpenMP offload JIT paper): N counts the
distinct variants this process has asked for, n_i the distinct values slot i (an argument,
the block or the grid) had among them. Before a new variant, every slot with N > T and
n_i / N > R stops being folded: from then on its value is a run-time parameter and one
variant serves all its values. So does a slot with n_i > T of its own: threads that each pass
their own constant beside a step counter, in step, ask for every (counter, constant) pair, so
the counter's n_i / N stays near 1 / threads and the ratio alone never drops it. Annotated
arguments (annotate("jit", ...)) are never dropped.

What the tracker learns outlives the process: when it stops folding a slot, the decision is
saved in the disk cache (a "policy" entry, keyed by the fat binary, the kernel, its
architecture, T and R), and the next run of the app starts from it. A step counter then costs
its T + 2 variants once, in the first run, not in every run; `proteus-rewrite prewarm` saves
the decisions a report records, and `proteus-rewrite cache clear` forgets them.

A "run" entry (keyed by the app's fat binaries) notes how many variants the app's last run
compiled: after a run that compiled nothing, the next one does not warm the compiler up ahead
(compiles_likely).

Compile budget: a kernel may spend max(grace, fraction x its GPU time) milliseconds on
compilation; past that, launches that would need a new variant run the original kernel
(variants already made, and cache hits, are still used). The GPU time is estimated by the
shim from events sampled on a few launches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from .jit.targets import target_for

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
    learned: list[str] = field(default_factory=list)  # of those, the ones an earlier run decided

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
                distinct = len(self.values.get(slot, ()))
                if distinct / self.variants > self.ratio or distinct > self.threshold:
                    self._drop(slot)
        self.variants += 1
        kept = self.slots()
        self.keys.add(b"\0".join(bytes(str(s), "ascii") + b"=" + values[s] for s in kept))
        for slot in kept:
            self.values.setdefault(slot, set()).add(values[slot])

    def start_from(self, learned: list[object]) -> None:
        """Apply an earlier run's decisions (never to an annotated argument)."""
        for slot in learned:
            if slot not in self.fixed and slot in self.slots():
                self._drop(slot)
                self.learned.append(str(slot))

    def _drop(self, slot: object) -> None:
        if slot == BLOCK:
            self.dims &= ~1
        elif slot == GRID:
            self.dims &= ~2
        else:
            self.folded.discard(slot)
        self.dropped.append(str(slot))


POLICY_KIND = "policy"  # the cache entry kind of a saved tracker decision


def policy_key(fatbin_sha256: str, kernel: str, arch: int | str, threshold: int, ratio: float) -> str:
    """The cache key of one kernel's saved decisions: other settings of T or R learn anew."""
    text = f"tracker-policy\0{fatbin_sha256}\0{kernel}\0{arch}\0{threshold}\0{ratio!r}"
    return hashlib.sha256(text.encode()).hexdigest()


def encode_learned(dropped: list[str]) -> bytes:
    return json.dumps({"stopped_folding": list(dropped)}).encode()


def save_learned(cache, key: str, arch: int | str, dropped: list[str], kernel: str) -> None:
    """Put one kernel's tracker decisions in the cache (`cache` a CacheChain): the run time
    at a compile thread's start and at exit, and prewarm from a report, write them alike. Not
    counted against the cache's size cap: a decision is a few bytes and the next run needs it."""
    from .cache import Entry

    cache.put(Entry(key, POLICY_KIND, arch, encode_learned(dropped), {"kernel": kernel}), enforce_cap=False)


def decode_learned(data: bytes) -> list[object]:
    """The slots a saved decision names: argument indices (int), BLOCK or GRID. A malformed
    entry names none (the checksum guards against damage; this against other writers)."""
    try:
        slots = json.loads(data)["stopped_folding"]
    except (ValueError, KeyError, TypeError):
        return []
    out: list[object] = []
    for s in slots if isinstance(slots, list) else ():
        if s in (BLOCK, GRID):
            out.append(s)
        elif isinstance(s, str) and s.isdigit():
            out.append(int(s))
    return out


RUN_KIND = "run"  # the cache entry kind of what an app's last run compiled


def run_key(fatbin_sha256s: list[str]) -> str:
    """The cache key of the note on an app's last run: its kernel stores' fat binaries."""
    text = "last-run\0" + "\0".join(sorted(fatbin_sha256s))
    return hashlib.sha256(text.encode()).hexdigest()


def encode_run(compiled: int) -> bytes:
    return json.dumps({"compiled": int(compiled)}).encode()


def decode_run(data: bytes) -> int | None:
    """How many variants the last run compiled, or None (a malformed note: nothing known)."""
    try:
        n = json.loads(data)["compiled"]
    except (ValueError, KeyError, TypeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


WARM_KIND = "warm"  # the cache entry kind of the launches whose variants an app's last run used
WARM_MAX = 64  # launches noted per app: a warm run loads at most these ahead


def warm_key(fatbin_sha256s: list[str]) -> str:
    """The cache key of the note on which variants an app's last run used."""
    text = "warm-set\0" + "\0".join(sorted(fatbin_sha256s))
    return hashlib.sha256(text.encode()).hexdigest()


def encode_warm(items: list[dict]) -> bytes:
    """Each item: the fat binary's SHA-256, the kernel's name and architecture, and its launch's
    folded arguments (parameter index -> bytes, hex), grid and block."""
    return json.dumps(items[:WARM_MAX], sort_keys=True, separators=(",", ":")).encode()


def decode_warm(data: bytes) -> list[dict]:
    """The items of a warm-set note; a malformed one (another writer, another version) is
    skipped, as is a note that is not a list."""
    try:
        items = json.loads(data)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []

    def dims(v: object) -> bool:
        return isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) and 0 < x < 1 << 32 for x in v)

    good = []
    for it in items[:WARM_MAX]:
        try:
            args = it["args"]
            # a note holds only launches the shim loads ahead: another platform's is another writer's
            ok = (target_for(it["arch"]).loads_ahead and isinstance(it["fatbin"], str) and isinstance(it["kernel"], str)
                  and isinstance(args, dict) and all(k.isdigit() and isinstance(v, str) and bytes.fromhex(v) for k, v in args.items())
                  and dims(it["grid"]) and dims(it["block"]))
        except (TypeError, KeyError, AttributeError, ValueError):
            ok = False
        if ok:
            good.append(it)
    return good


def compiles_likely(last_compiled: int | None) -> bool:
    """Whether to warm the compiler up ahead (the prestart thread, beside the context's creation).
    Unknown counts as likely: a first run compiles. A run after one that compiled nothing
    (steady state, or a prewarmed cache) skips it: the warm-up loads LLVM and nvJitLink, whose
    pages and exit-time destructors make the process's exit several times longer than with the
    run time alone imported (docs/dev/findings/startup-and-exit.md). Guessed wrong, the first
    variant waits for the warm-up on its compile thread, and this run's note makes the next one
    warm up ahead."""
    return last_compiled is None or last_compiled > 0


@dataclass
class Budget:
    fraction: float
    grace_ms: float

    def allows(self, compile_ms: float, gpu_ms: float) -> bool:
        return compile_ms < max(self.grace_ms, self.fraction * gpu_ms)
