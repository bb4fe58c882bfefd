"""The run as a whole: the compiler's preparation ahead of the first variant, what the app's
last run compiled (the guess whether this one will), and the end of the run (finish)."""

from __future__ import annotations

from .. import compat
from ..cache import Entry
from ..jit import specializer as spec_mod
from ..policy import RUN_KIND, compiles_likely, decode_run, encode_run, run_key
from . import first_launch, speed, trace, warm
from .report import parse_counters
from .session import Session

WARM_UP_ARCH = 75  # the oldest architecture CUDA 13 compiles for: any will do to warm the compiler up


def prepare_compiler(session: Session, arch: int, ahead: int = 0) -> bool:
    """The compiler's first use, ahead of any specialization (specializer.warm_up): loading
    LLVM and nvJitLink and one small compilation. The shim calls it on its prestart thread while
    the app creates its CUDA context (arch 0: none known yet; ahead), or else before it starts
    compile threads, so that LLVM's and nvJitLink's exit-time destructors are registered before
    the shim's exit hook that waits for those threads. Ahead, it may decline (False: not done)
    when the app's last run compiled nothing; a compile thread then does it before its first
    job. Not with PROTEUS_ASYNC_COMPILATION=0, where the app's own thread would."""
    config, driver = session.config, session.driver_version or None
    if ahead and config.async_compilation != "0" and not compiles_likely(last_run(session)):
        session.warm_up_skipped = True
        session.trace("variants", "the app's last run compiled nothing: the compiler is not warmed up ahead")
        try:
            spec_mod.prepare_keys(config, driver)
        except Exception as exc:  # the first launch meets it again, and reports it per kernel
            session.trace("variants", f"preparing cache keys: {type(exc).__name__}: {exc}")
        return False
    try:
        if session.compiler is not None:  # it warms up by itself, while this thread goes on
            session.compiler.start(arch or WARM_UP_ARCH, config.for_kernel("proteus_warm_up"), driver)
            spec_mod.prepare_keys(config, driver)
            session.trace("variants", "compiler process started")
        else:
            ms = spec_mod.warm_up(arch or WARM_UP_ARCH, config, driver)
            session.trace("variants", f"compiler ready ({ms:.0f} ms)")
    except Exception as exc:  # a real compilation will meet it again and report it per kernel
        session.trace("variants", f"preparing the compiler: {type(exc).__name__}: {exc}")
    return True


def last_run(session: Session) -> int | None:
    """How many variants the app's last run compiled, from its note in the disk cache."""
    if not session.last_run_read:
        disk = session.disk()
        if disk is not None and session.tables:
            entry = disk.get(run_key(session.fatbin_digests()), counted=False)
            if entry is not None and entry.kind == RUN_KIND:
                session.last_run = decode_run(entry.data)
        session.last_run_read = True
    return session.last_run


def compiled_this_run(session: Session) -> int:
    """Variants compiled, or queued for a compile thread and not compiled, in this process."""
    return sum(s.specializations + len(s.queued) for s in session.stats)


def finish(session: Session, counters: bytes = b"", trials: bytes = b"") -> None:
    """At exit, from the shim, with its per-kernel counters (protocol.COUNTERS) and what it
    followed of each variant (protocol.VARIANT: speed.received keeps the verdicts and launches):
    upstream's end-of-run trace lines and the time trace (trace.at_exit); save the tracker's
    decisions no compile thread saved; each kernel's profile for a later run's first launch
    (first_launch.note); note which launches this run's variants served
    (warm.note); note for the next run whether this one compiled, where that changes its guess
    (policy.compiles_likely): a steady run writes nothing."""
    try:
        if not session.tables or session.config.disable:
            return
        speed.received(session, trials)
        _trace_at_exit(session, counters)
        session.save_policies()
        first_launch.note(session, counters)
        warm.note(session)
        compiled = compiled_this_run(session)
        if (compiled > 0) != compiles_likely(last_run(session)):
            session.cache.put(Entry(run_key(session.fatbin_digests()), RUN_KIND, 0, encode_run(compiled),
                                    {"kernel": "(the app's last run)"}), enforce_cap=False)
    except Exception as exc:  # never into C
        session.trace("variants", f"noting the run: {type(exc).__name__}: {exc}")


def _trace_at_exit(session: Session, counters: bytes) -> None:
    kernels, entries = [], []
    for kid, launches, table_hits, *_, name in parse_counters(counters):
        variants = session.stats[kid].variants if kid >= 0 else []
        kernels.append((session.stats[kid].demangled if kid >= 0 else name, len(variants), launches))
        # upstream's in-memory cache entries: per variant its launches, the first a miss
        entries += [(compat.hash_value(v["cache_key"]), v["launches"], v["launches"] - 1) for v in variants if v.get("launches")]
    disk = session.cache.stats().get("disk")
    trace.at_exit(session.config, kernels, (sum(e[2] for e in entries), sum(e[1] for e in entries)),
                  (disk.hits, disk.hits + disk.misses) if disk is not None else (0, 0), entries)
