"""A variant for one launch, or the original kernel: the miss flow, as named steps.

    decode    the launch as the specializer takes it: its device variables' addresses known,
              the device's target one the kernel's bitcode may be compiled for
    budget    may this launch compile (the kernel's compile budget), and may the kernel be
              specialized at all (validation's denials)
    cache     the caches alone, before waiting for the compiler process's warm-up
    compile   compile (the specializer asks the caches first), within the budget; a miss that
              would queue the kernel's first variant compiles it here where the kernel's
              profile from earlier runs says waiting pays (first_launch)
    verdict   an earlier run's speed verdict, the statistics, the trace and the dumps; the answer

Each step takes the session and the launch's context (Miss). The steps up to compile raise to
stop the flow: a CompileBudgetSpent ends it in `spent` (queued for a compile thread, or refused
by the budget), anything else in `failed` (one warning per kernel); either way the original
kernel runs. Where another process holds the claim to compile the variant (a cache shared by
ranks), a compile thread waits for its entry (up to the cache's lease, the app running the
original meanwhile: as a variant still compiling), then takes the claim over; a tombstone (the
variant failed elsewhere) ends in `failed`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import faults
from ..errors import ProteusError
from ..fatbin.table import KernelRecord, KernelTable
from ..jit import specializer as spec_mod
from ..jit.launch import Launch
from ..jit.targets import Target, target_for
from ..policy import BLOCK, GRID, Budget
from . import first_launch, protocol, speed, trace, validate
from .launch import RawLaunch
from .report import LaunchRecord
from .session import KernelStats, Session

MAX_QUEUED_RECORDS = 256  # per kernel; a value that changes on every launch stops being folded long before


@dataclass
class Miss:
    """One launch on its way through the flow."""

    kid: int
    table: KernelTable
    record: KernelRecord
    stats: KernelStats
    raw: RawLaunch
    target: Target  # the device's
    gpu_ms: float  # the shim's estimate of the kernel's GPU time, for the budget
    cached_only: int  # protocol.CACHED_ONLY or CACHED_AHEAD: ask the caches only
    started: float  # perf_counter
    may_compile: bool = False
    missing: str | None = None  # a key just found in no cache: not asked for again
    launch: Launch | None = None  # what the specializer was last handed: the launch the records describe
    result: spec_mod.Result | None = None
    remembered: dict | None = None  # an earlier run's speed verdict on the variant
    waited: dict | None = None  # compiled on the launching thread, as the kernel's profile advised (first_launch)
    trial_flags: int = protocol.IMAGE_TRIAL  # the image's flags where there is none (speed.remembered)

    @property
    def arch(self) -> int | str:
        return self.target.arch


def specialize(session: Session, kid: int, raw: RawLaunch, arch: int | str, gpu_ms: float = 0.0,
               cached_only: int = 0) -> bytes | None:
    """The variant's image answer (protocol.image_answer), or None to run the original. With
    cached_only, only the caches are asked, and b"" means the variant needs compiling
    (protocol.CACHED_ONLY: the shim then queues it; CACHED_AHEAD: a launch the last run noted,
    loaded ahead, and nothing is queued)."""
    table, record = session.kernels[kid]
    miss = Miss(kid, table, record, session.stats[kid], raw, target_for(arch), gpu_ms, cached_only, time.perf_counter())
    miss.stats.gpu_ms = gpu_ms
    try:
        if not cached_only:
            session.save_policies()
        decode(session, miss)
        budget(session, miss)
        cache(session, miss)
        compile(session, miss)
    except spec_mod.CompileBudgetSpent as exc:
        return spent(session, miss, exc)
    except Exception as exc:  # noqa: BLE001  never into C: the original runs
        return failed(session, miss, exc)
    return verdict(session, miss)


def decode(session: Session, miss: Miss) -> None:
    record = miss.record
    unknown = [g for g, a in zip(record.globals, miss.raw.addresses) if not a]
    if unknown:
        raise ProteusError(f"the AOT address of {', '.join(unknown)} is unknown")
    if not miss.target.accepts(record.arch):
        raise ProteusError(f"its bitcode was recorded for {record.arch}, this device is a {miss.arch}")
    faults.check("specialize")


def budget(session: Session, miss: Miss) -> None:
    miss.may_compile = _within_budget(session, miss)
    if not miss.target.validates and validate.requested():
        raise ProteusError("PROTEUS_VALIDATE=1 checks CUDA variants only: under it, HIP kernels run as built")
    if (why := validate.denied(session, miss.record.name)) is not None:
        raise ProteusError(f"denied by validation ({why.get('reason', 'no reason recorded')})")


def _within_budget(session: Session, miss: Miss) -> bool:
    # compile threads (PROTEUS_ASYNC_THREADS) may compile two variants of one kernel at once:
    # the time the running ones have spent so far counts against its budget too
    config, stats = session.config, miss.stats
    now = time.perf_counter()
    spent_ms = stats.compile_ms + sum((now - t0) * 1000.0 for t0 in stats.compiling.values())
    return not config.compile_budget or Budget(config.compile_budget, config.compile_grace_ms).allows(spent_ms, miss.gpu_ms)


def cache(session: Session, miss: Miss) -> None:
    """A launching thread that may compile (PROTEUS_ASYNC_COMPILATION=0) asks the caches before
    it waits for the compiler process's warm-up: a variant they hold needs no compiler, and a
    warm run's launch would otherwise wait for the warm-up inside the app's timed loop
    (docs/dev/findings.md, "A synchronous warm run asks the caches first")."""
    if miss.cached_only or session.compiler is None:
        return
    try:
        miss.result = _attempt(session, miss, may_compile=False)
    except spec_mod.CompileBudgetSpent as exc:
        # the warm-up, before the tracker's policy is read again for the compilation (Compilers.ready)
        session.compiler.ready()
        miss.missing = exc.key


def compile(session: Session, miss: Miss) -> None:
    if miss.result is not None:
        return
    # asked again: compiler.ready() let go of the GIL, and another compile thread may have
    # started on this kernel meanwhile; nothing from here to the mark lets go of it
    miss.may_compile = miss.may_compile and _within_budget(session, miss)
    if miss.may_compile and miss.cached_only:  # a miss that would queue it: compile here where waiting pays
        miss.waited = first_launch.waits(session, miss.kid, miss.cached_only)
        if miss.waited is not None and session.compiler is not None:
            session.compiler.ready()
    compiles = miss.may_compile and (not miss.cached_only or miss.waited is not None)
    token = object()
    if compiles:
        miss.stats.compiling[token] = time.perf_counter()
    try:
        miss.result = _attempt(session, miss, may_compile=compiles)
    finally:
        miss.stats.compiling.pop(token, None)


def _attempt(session: Session, miss: Miss, may_compile: bool) -> spec_mod.Result:
    """The specializer over the launch as the tracker's latest policy sees it: at least as
    general as the key this launch came with (the policy may have changed since)."""
    raw, record, tracker = miss.raw, miss.record, miss.stats.tracker
    unknown, unknown_dims = frozenset(), frozenset()
    if tracker is not None:
        unknown = frozenset(i for i in range(len(raw.args)) if i not in tracker.folded)
        unknown_dims = frozenset(d for d, bit in ((BLOCK, protocol.DIMS_BLOCK), (GRID, protocol.DIMS_GRID))
                                 if not tracker.dims & bit)
    miss.launch = Launch(raw.args, raw.grid, raw.block, miss.arch, dict(zip(record.globals, raw.addresses)), unknown,
                         unknown_dims)
    config = session.config
    return spec_mod.specialize(miss.table, record, miss.launch, config, session.cache,
                               keep_ir="ir-dump" in config.trace or config.dump_ir,
                               driver_version=session.driver_version or None, may_compile=may_compile,
                               compiler=session.compiler, missing=miss.missing)


def spent(session: Session, miss: Miss, exc: spec_mod.CompileBudgetSpent) -> bytes | None:
    """The variant is in no cache and this launch does not compile it: b"" where a compile
    thread will (the shim queues it; the report lists its launch until it is compiled), None
    where the budget refused it (a policy, not a failure: no warning)."""
    stats = miss.stats
    if isinstance(exc, spec_mod.ClaimedElsewhere):
        # another process holds the claim to compile it: as a variant still compiling, the
        # original runs and the variant is asked for again (the compile thread waits for it)
        if len(stats.queued) < MAX_QUEUED_RECORDS and exc.key not in stats.queued and miss.launch is not None:
            stats.queued[exc.key] = LaunchRecord.of(miss.raw, exc.folded, miss.launch.unknown_dims, miss.arch,
                                                    miss.record).to_json()
        session.trace("variants", f"{miss.record.demangled}: variant {exc.key[:12]} is being compiled by another "
                      "process; running the original kernel")
        return b"" if miss.cached_only else None
    if miss.cached_only and miss.may_compile:
        if (miss.cached_only == protocol.CACHED_ONLY and len(stats.queued) < MAX_QUEUED_RECORDS
                and exc.key not in stats.queued):
            assert miss.launch is not None  # (set by the attempt that raised)
            stats.queued[exc.key] = LaunchRecord.of(miss.raw, exc.folded, miss.launch.unknown_dims, miss.arch,
                                                    miss.record).to_json()
        return b""
    stats.budget_refusals += 1
    session.trace("variants", f"{miss.record.demangled}: compile budget spent ({stats.compile_ms:.0f} ms compiling, "
                  f"{miss.gpu_ms:.0f} ms on the GPU); running the original kernel")
    return None


def failed(session: Session, miss: Miss, exc: Exception) -> None:
    reason = str(exc) if isinstance(exc, ProteusError) else f"{type(exc).__name__}: {exc}"
    miss.stats.failures[reason] = miss.stats.failures.get(reason, 0) + 1
    session.warn_once(f"spec:{miss.record.name}", f"{miss.record.demangled}: not specialized ({reason}); "
                      "running the original kernel")
    return None


def verdict(session: Session, miss: Miss) -> bytes | None:
    """The variant's answer, unless an earlier run's speed trial found it slower than the
    original; its statistics, report entry, trace and dumps."""
    result = miss.result
    assert result is not None
    miss.stats.queued.pop(result.key, None)
    if session.config.speed_check and miss.target.speed_trials:
        miss.remembered, miss.trial_flags = speed.remembered(session, result.key)
    if miss.remembered is not None and miss.remembered["verdict"] == "slower":
        miss.stats.slower_declined.append({"cache_key": result.key, "speed": miss.remembered})
        session.trace("variants", f"{miss.record.demangled}: variant {result.key[:12]} was slower than the original in "
                      "an earlier run: running the original kernel")
        return None
    flags = _count(session, miss)
    _trace(session, miss)
    return protocol.image_answer(result.entry, result.image.data, len(miss.stats.variants), flags)


def _count(session: Session, miss: Miss) -> int:
    """The variant into the kernel's statistics and report entry; the image's flags."""
    result, stats = miss.result, miss.stats
    assert result is not None and miss.launch is not None
    if result.source == "compiled":
        stats.specializations += 1
        stats.compile_ms += result.timings_ms.get("total", 0.0)
    elif result.source == "disk":
        stats.disk_hits += 1
    else:
        stats.memory_hits += 1
    block, grid = miss.raw.block, miss.raw.grid
    variant = {"key": result.key[:16], "cache_key": result.key, "source": result.source,
               "folded": {str(i): v for i, v in result.folded.items()},
               "block": list(block), "grid": list(grid), "ms": round(result.timings_ms.get("total", 0.0), 2),
               "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()},
               "launch": LaunchRecord.of(miss.raw, tuple(result.folded), miss.launch.unknown_dims, miss.arch,
                                         miss.record).to_json()}
    stats.variants.append(variant)
    if miss.cached_only == protocol.CACHED_AHEAD:  # before any launch of it (runtime/warm.py)
        variant["loaded_ahead"] = True
    if miss.waited is not None and result.source == "compiled":
        variant["first_launch_waited"] = miss.waited
    check = validate.check_flag(session, result.key, miss.target.validates)  # its first launch compared first
    if check:
        variant["check"] = {"verdict": "pending"}
    if miss.remembered is not None:
        variant["speed"] = {**miss.remembered, "remembered": True}
        return check
    if session.config.speed_check and miss.target.speed_trials:  # a speed trial (shim/trial.c): no run has judged it
        variant["trial"] = True  # speed.received takes it off with the outcome
        return miss.trial_flags | check
    return check


def _trace(session: Session, miss: Miss) -> None:
    """Upstream's lines and timers, the time trace, ours, and the IR (ir-dump, PROTEUS_DUMP_IR)."""
    result, record, config = miss.result, miss.record, session.config
    assert result is not None
    block, grid = miss.raw.block, miss.raw.grid
    trace.specialization(config, config.for_record(record), record, result, block, grid,
                         miss.raw.args)
    trace.event(config, f"{result.source} {record.demangled}", miss.started, time.perf_counter() - miss.started,
                ", ".join(f"{k} {v:.1f} ms" for k, v in result.timings_ms.items()))
    session.trace("variants", f"{record.demangled}: variant {result.key[:12]} ({result.source}) folded "
                  f"{ {i: v for i, v in result.folded.items()} } block {tuple(block)} grid {tuple(grid)} "
                  f"{result.timings_ms.get('total', 0.0):.1f} ms")
    if result.ir_text is not None:
        session.trace("ir-dump", f"IR of {record.demangled} variant {result.key[:12]}:\n{result.ir_text}")
        if config.dump_ir:
            os.makedirs(".proteus-dump", exist_ok=True)
            Path(f".proteus-dump/device-jit-{result.key}.ll").write_text(result.ir_text)


def load_failed(session: Session, kid: int, code: int) -> None:
    """The driver (HIP: the runtime) refused a variant's image: the kernel runs the original."""
    record = session.kernels[kid][1]
    reason = target_for(record.arch).load_failure(code)
    stats = session.stats[kid]
    stats.failures[reason] = stats.failures.get(reason, 0) + 1
    session.warn_once(f"load:{record.name}", f"{record.demangled}: {reason}; running the original kernel")
