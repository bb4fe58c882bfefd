"""A kernel's first launch in `auto` (issue #51): wait for its variant where waiting pays.

`auto` compiles a kernel's first variant on a compile thread while its launch runs the
original. A kernel launched once, or a few times early in the run, then never runs a variant
in a cold run, however long it runs (docs/dev/findings/background-compilation.md, "Short runs").
Waiting pays where the variant's gain over the rest of the run is larger than the compilation:
the kernel's GPU time in a run times (1 - the variant's time over the original's), against
the compile time. A first-ever run knows none of them. An earlier run does: the shim's sampled
GPU time, the compile times and the speed trials' verdicts. So each run leaves, per kernel, a
profile in the cache (PROFILE_KIND), and a later run's first miss of the kernel, which would
queue its variant, compiles it on the launching thread instead where that profile says the
wait pays (the gain at least twice the compile time). Not a kernel whose variants the trials found slower, nor one never judged.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, dataclass

from ..cache import Entry
from . import protocol
from .report import parse_counters
from .session import Session

PROFILE_KIND = "profile"  # the cache entry kind of a kernel's profile
CHANGE = 0.10  # a profile is written again only where a figure moved by more than this
# The gain must exceed the compile time this many times over: the wait also holds the compiler's
# warm-up where the run has not done it yet, and both figures come from one earlier run.
MARGIN = 2.0


@dataclass
class Profile:
    """One run of a kernel: its launches and GPU time (sampled, estimated for all launches),
    the mean time one of its variants took to compile, and its variants' time over the
    original's as the speed trials judged them (their median; None: none judged)."""

    launches: int
    gpu_ms: float
    compile_ms: float
    ratio: float | None

    def gain_ms(self) -> float:
        """What a variant that serves every launch saves in a run, as this profile sees it."""
        return self.gpu_ms * (1.0 - self.ratio) if self.ratio is not None else 0.0


def _key(session: Session, kid: int) -> str | None:
    table, record = session.kernels[kid]
    fatbin = table.fatbin(record.fatbin)
    if fatbin is None:
        return None
    return hashlib.sha256(f"profile:{fatbin.sha256}:{record.name}:{record.arch}".encode()).hexdigest()


def load(session: Session, kid: int) -> Profile | None:
    key = _key(session, kid)
    hit = session.cache.get(key, counted=False) if key else None
    if hit is None or hit[0].kind != PROFILE_KIND:
        return None
    try:
        return Profile(**json.loads(hit[0].data))
    except (TypeError, ValueError):
        return None


def waits(session: Session, kid: int, cached_only: int) -> dict | None:
    """Where this miss should compile on the launching thread rather than queue its variant:
    what the kernel's profile expects of the wait ({"gain_ms", "compile_ms"}), else None. Only
    the kernel's first variant of the run, in `auto`, on a miss that would queue it."""
    stats = session.stats[kid]
    if cached_only != protocol.CACHED_ONLY or session.config.async_compilation != "auto":
        return None
    if stats.specializations or stats.queued:
        return None
    profile = load(session, kid)
    if profile is None or profile.ratio is None or profile.ratio >= 1.0 or profile.compile_ms <= 0:
        return None
    if profile.gain_ms() <= MARGIN * profile.compile_ms:
        return None
    return {"gain_ms": round(profile.gain_ms(), 1), "compile_ms": round(profile.compile_ms, 1)}


def note(session: Session, counters: bytes) -> None:
    """At exit: the profile of each launched kernel that had a variant in this run, where it
    differs from the one the cache holds (a steady app writes nothing). What this run did not
    measure (no sample, no compilation, no verdict) is kept from the earlier profile."""
    for kid, launches, *_, gpu_us, _graph_nodes, _awaiting, _name in parse_counters(counters):
        if kid < 0 or not launches:
            continue
        stats = session.stats[kid]
        if not stats.variants:  # nothing to wait for next time that this run could add to: no cache I/O at exit
            continue
        old = load(session, kid)
        ratios = [v["speed"]["variant_over_original"] for v in stats.variants
                  if (v.get("speed") or {}).get("verdict") in ("kept", "slower")
                  and v["speed"].get("variant_over_original")]
        new = Profile(launches,
                      gpu_us / 1000.0 if gpu_us else (old.gpu_ms if old else 0.0),
                      stats.compile_ms / stats.specializations if stats.specializations else (old.compile_ms if old else 0.0),
                      round(statistics.median(ratios), 4) if ratios else (old.ratio if old else None))
        if old is not None and not _moved(old, new):
            continue
        key = _key(session, kid)
        if key:
            record = session.kernels[kid][1]
            session.cache.put(Entry(key, PROFILE_KIND, record.arch, json.dumps(asdict(new)).encode(),
                                    {"kernel": record.demangled}), enforce_cap=False)


def _moved(old: Profile, new: Profile) -> bool:
    if (old.ratio is None) != (new.ratio is None):
        return True
    pairs = [(old.launches, new.launches), (old.gpu_ms, new.gpu_ms), (old.compile_ms, new.compile_ms)]
    if old.ratio is not None and new.ratio is not None:
        pairs.append((old.ratio, new.ratio))
    return any(abs(a - b) > CHANGE * max(abs(a), abs(b)) for a, b in pairs)
