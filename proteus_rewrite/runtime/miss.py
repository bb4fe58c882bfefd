"""What the shim asks on a miss (a launch whose key its table lacks): the value tracker's
policy, the caches and, when they have nothing, a compilation; and the compiler's preparation and
the end of the run."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from .. import compat, faults
from ..cache import StorageCache
from ..errors import ProteusError
from ..jit import specializer as spec_mod
from ..jit.launch import Launch
from ..policy import (BLOCK, GRID, RUN_KIND, Budget, compiles_likely, decode_run, encode_run, run_key, save_learned)
from ..cache import Entry
from . import protocol, session, speed, trace, validate, warm


def track(kid: int, args: bytes, grid: tuple, block: tuple, earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks. Returns the kernel's policy, which the shim's
    key follows from now on: u32 dims (bit 0 block, bit 1 grid); u8 fold[nparams]. `earlier`:
    launches of the kernel the shim deferred (DEFERRED), seen first, in order."""
    return _track(kid, (args, grid, block), earlier)[0]


def track_deferred(kid: int, earlier: bytes) -> bytes:
    """Launches the shim deferred (their variants queued unasked), from a compile thread before
    it takes a job, which a policy they change makes stale, and at exit. Returns the policy."""
    return _track(kid, None, earlier)[0]


def _track(kid: int, launch: tuple[bytes, tuple, tuple] | None, earlier: bytes = b"") -> tuple[bytes, bool]:
    """The policy (as track), and whether these launches changed it: the deferred ones in
    `earlier`, then `launch` (args, grid, block; None: none)."""
    assert session._state is not None
    record, stats = session._state.kernels[kid][1], session._state.stats[kid]
    tracker = stats.tracker
    if tracker is None:
        return b"", False  # no tracker: the policy never changes (the shim ignores an empty answer)
    before = len(tracker.dropped)
    try:
        offsets, off = [], 0
        for p in record.params:
            offsets.append(off)
            off += p.size

        def see(args: bytes, grid: tuple, block: tuple) -> None:
            tracker.before({**{i: args[offsets[i] : offsets[i] + record.params[i].size] for i in tracker.folded},
                            BLOCK: struct.pack("<3I", *block), GRID: struct.pack("<3I", *grid)})

        step = protocol.DEFERRED.size + off
        for at in range(0, len(earlier) - step + 1, step):
            dims = protocol.DEFERRED.unpack_from(earlier, at)
            see(earlier[at + protocol.DEFERRED.size : at + step], dims[:3], dims[3:])
        if launch is not None:
            see(*launch)
    except Exception as exc:  # never into C; the policy simply stays as it was
        session.warn_once(f"track:{record.name}", f"{record.demangled}: value tracker: {type(exc).__name__}: {exc}")
    changed = len(tracker.dropped) != before
    if changed and stats.policy_key:  # the next run starts from here: saved off this thread (_save_policies)
        stats.policy_unsaved = True
    policy = protocol.POLICY_HEAD.pack(tracker.dims) + bytes(1 if i in tracker.folded else 0 for i in range(len(record.params)))
    return policy, changed


def _save_policies() -> None:
    """Write the tracker decisions not saved yet to the disk cache. Not on a launching thread
    where that can be helped: a put is a dozen system calls, each a chance for another thread to
    take the GIL, which the launch then waits for. A compile thread does it before compiling,
    and finish() at exit."""
    assert session._state is not None
    for (_, record), stats in zip(session._state.kernels, session._state.stats):
        if stats.policy_unsaved and stats.tracker is not None:
            stats.policy_unsaved = False
            save_learned(session._state.cache, stats.policy_key, record.arch, stats.tracker.dropped, record.demangled)


MAX_QUEUED_RECORDS = 256  # per kernel; a value that changes on every launch stops being folded long before

def miss(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int, gpu_ms: float = 0.0,
         cached_only: int = 0, earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks, in one call: one wait for the GIL on the
    launching thread where track and specialize took two (at a cold start, while the prestart
    or a compile thread runs Python, each such wait was up to the switch interval or longer).
    The tracker sees the launch, after the ones the shim deferred (`earlier`, as track); if that
    changed the kernel's policy, the launch's key is stale
    and nothing more is done (protocol.MISS_POLICY_CHANGED: the shim builds the key anew and calls
    specialize); otherwise specialize answers (protocol.MISS_IMAGE, with the image, empty when it needs
    compiling; protocol.MISS_ORIGINAL for None). Layout: MISS_HEADER, the policy (as track), the image."""
    t0 = time.perf_counter_ns()
    policy, changed = _track(kid, (args, grid, block), earlier)
    tracked = min(time.perf_counter_ns() - t0, 0xFFFFFFFF)
    if changed:
        return protocol.MISS_HEADER.pack(protocol.MISS_POLICY_CHANGED, tracked, len(policy)) + policy
    image = specialize(kid, args, grid, block, globals_, arch, gpu_ms, cached_only)
    if image is None:
        return protocol.MISS_HEADER.pack(protocol.MISS_ORIGINAL, tracked, len(policy)) + policy
    return protocol.MISS_HEADER.pack(protocol.MISS_IMAGE, tracked, len(policy)) + policy + image


def _launch_record(raw, folded, unknown_dims, arch, block, grid, globals_, addrs) -> dict:
    """A launch as the report records it, enough to compile its variant again offline (prewarm)."""
    return {"args": {str(i): raw[i].hex() for i in sorted(folded)}, "unknown_dims": sorted(unknown_dims), "arch": arch,
            "block": list(block), "grid": list(grid), "globals": {g: a for g, a in zip(globals_, addrs)}}


def specialize(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int | str,
               gpu_ms: float = 0.0, cached_only: int = 0) -> bytes | None:
    """The variant's image, or None to run the original. With cached_only, only the caches are
    asked, and b"" means the variant needs compiling (protocol.CACHED_ONLY: the shim then queues
    it; CACHED_AHEAD: a launch the last run noted, loaded ahead, and nothing is queued)."""
    assert session._state is not None
    t_start = time.perf_counter()
    if isinstance(arch, str):  # HIP's gcnArchName: gfx90a:sramecc+:xnack- -> gfx90a
        arch = arch.split(":", 1)[0]
    table, record = session._state.kernels[kid]
    stats = session._state.stats[kid]
    stats.gpu_ms = gpu_ms
    try:
        if not cached_only:
            _save_policies()
        raw, off = [], 0
        for p in record.params:
            raw.append(args[off : off + p.size])
            off += p.size
        addrs = struct.unpack(f"<{len(record.globals)}Q", globals_) if record.globals else ()
        missing = [g for g, a in zip(record.globals, addrs) if not a]
        if missing:
            raise ProteusError(f"the AOT address of {', '.join(missing)} is unknown")

        def launch_now() -> Launch:
            unknown, unknown_dims = frozenset(), frozenset()
            tracker = stats.tracker
            if tracker is not None:  # its latest policy: at least as general as the key this launch came with
                unknown = frozenset(i for i in range(len(raw)) if i not in tracker.folded)
                unknown_dims = frozenset(d for d, bit in ((BLOCK, 1), (GRID, 2)) if not tracker.dims & bit)
            return Launch(tuple(raw), tuple(grid), tuple(block), arch, dict(zip(record.globals, addrs)), unknown, unknown_dims)

        launch: Launch | None = None   # set by attempt(): the launch the records below describe
        keep_ir = "ir-dump" in session._state.config.trace or session._state.config.dump_ir
        config = session._state.config
        def budget_allows() -> bool:
            # compile threads (PROTEUS_ASYNC_THREADS) may compile two variants of one kernel at
            # once: the time the running ones have spent so far counts against its budget too
            now = time.perf_counter()
            spent = stats.compile_ms + sum((now - t0) * 1000.0 for t0 in stats.compiling.values())
            return not config.compile_budget or Budget(config.compile_budget, config.compile_grace_ms).allows(spent, gpu_ms)

        may_compile = budget_allows()
        if isinstance(arch, str) and arch != record.arch:  # HIP: a module built for one processor runs on no other
            raise ProteusError(f"its bitcode was recorded for {record.arch}, this device is a {arch}")
        faults.check("specialize")
        if isinstance(arch, str) and validate.requested():
            raise ProteusError("PROTEUS_VALIDATE checks CUDA variants only: under it, HIP kernels run as built")
        if (why := validate.denied(record.name)) is not None:
            raise ProteusError(f"denied by validation ({why.get('reason', 'no reason recorded')})")

        def attempt(compile_ok: bool, missing: str | None = None) -> spec_mod.Result:
            nonlocal launch
            launch = launch_now()
            return spec_mod.specialize(table, record, launch, config, session._state.cache, keep_ir=keep_ir,
                                       driver_version=session._state.driver_version or None, may_compile=compile_ok,
                                       compiler=session._state.compiler, missing=missing)

        result, missing = None, None
        if not cached_only and session._state.compiler is not None:
            # The caches first: a variant they hold needs no compiler, so a warm run's launch
            # (PROTEUS_ASYNC_COMPILATION=0) does not wait for the compiler process's warm-up
            # (H100, adam: 200-250 ms, all of it inside the app's timed loop).
            try:
                result = attempt(False)
            except spec_mod.CompileBudgetSpent as exc:
                # then the warm-up before the tracker's policy is read again (see Compilers.ready)
                session._state.compiler.ready()
                missing = exc.key
        if result is None:
            # asked again: compiler.ready() above let go of the GIL, and another compile thread
            # may have started on this kernel meanwhile; nothing from here to the mark lets go of it
            may_compile = may_compile and budget_allows()
            token = object()
            if may_compile and not cached_only:
                stats.compiling[token] = time.perf_counter()
            try:
                result = attempt(may_compile and not cached_only, missing)
            finally:
                stats.compiling.pop(token, None)
    except spec_mod.CompileBudgetSpent as exc:
        if cached_only and may_compile:  # not in a cache: the shim queues it for a compile thread
            if cached_only == protocol.CACHED_ONLY and len(stats.queued) < MAX_QUEUED_RECORDS and exc.key not in stats.queued:
                stats.queued[exc.key] = _launch_record(raw, exc.folded, launch.unknown_dims, arch, block, grid, record.globals, addrs)
            return b""
        stats.budget_refusals += 1  # policy, not a failure: no warning
        session.trace("variants", f"{record.demangled}: compile budget spent ({stats.compile_ms:.0f} ms compiling, "
               f"{gpu_ms:.0f} ms on the GPU); running the original kernel")
        return None
    except Exception as exc:
        reason = str(exc) if isinstance(exc, ProteusError) else f"{type(exc).__name__}: {exc}"
        stats.failures[reason] = stats.failures.get(reason, 0) + 1
        session.warn_once(f"spec:{record.name}", f"{record.demangled}: not specialized ({reason}); running the original kernel")
        return None
    stats.queued.pop(result.key, None)
    verdict = speed.remembered(result.key) if session._state.config.speed_check and not isinstance(arch, str) else None
    if verdict is not None and verdict["verdict"] == "slower":
        stats.slower_declined.append({"cache_key": result.key, "speed": verdict})
        session.trace("variants", f"{record.demangled}: variant {result.key[:12]} was slower than the original in an "
                      "earlier run: running the original kernel")
        return None
    if result.source == "compiled":
        stats.specializations += 1
        stats.compile_ms += result.timings_ms.get("total", 0.0)
    elif result.source == "disk":
        stats.disk_hits += 1
    else:
        stats.memory_hits += 1
    stats.variants.append({"key": result.key[:16], "cache_key": result.key, "source": result.source,
                           "folded": {str(i): v for i, v in result.folded.items()},
                           "block": list(block), "grid": list(grid), "ms": round(result.timings_ms.get("total", 0.0), 2),
                           "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()},
                           # enough to compile this variant again offline (proteus-rewrite prewarm)
                           "launch": _launch_record(raw, tuple(result.folded), launch.unknown_dims, arch, block, grid,
                                                    record.globals, addrs)})
    if cached_only == protocol.CACHED_AHEAD:  # before any launch of it (runtime/warm.py)
        stats.variants[-1]["loaded_ahead"] = True
    # a speed trial (shim/trial.c) for a variant no run has timed; HIP takes no GPU-time samples
    flags = 0
    if verdict is not None:
        stats.variants[-1]["speed"] = {**verdict, "remembered": True}
    elif session._state.config.speed_check and not isinstance(arch, str):
        flags = protocol.IMAGE_TRIAL
        stats.variants[-1]["trial"] = True  # speed.received takes it off with the outcome
    cg = session._state.config.for_kernel(record.name, record.demangled)
    trace.specialization(session._state.config, cg, record, result, block, grid, raw)
    trace.event(session._state.config, f"{result.source} {record.demangled}", t_start,
                time.perf_counter() - t_start, ", ".join(f"{k} {v:.1f} ms" for k, v in result.timings_ms.items()))
    session.trace("variants", f"{record.demangled}: variant {result.key[:12]} ({result.source}) folded "
           f"{ {i: v for i, v in result.folded.items()} } block {tuple(block)} grid {tuple(grid)} "
           f"{result.timings_ms.get('total', 0.0):.1f} ms")
    if result.ir_text is not None:
        session.trace("ir-dump", f"IR of {record.demangled} variant {result.key[:12]}:\n{result.ir_text}")
        if session._state.config.dump_ir:
            os.makedirs(".proteus-dump", exist_ok=True)
            Path(f".proteus-dump/device-jit-{result.key}.ll").write_text(result.ir_text)
    return protocol.image_answer(result.entry, result.image.data, len(stats.variants), flags)


WARM_UP_ARCH = 75  # the oldest architecture CUDA 13 compiles for: any will do to warm the compiler up


def prepare_compiler(arch: int, ahead: int = 0) -> bool:
    """The compiler's first use, ahead of any specialization (specializer.warm_up): loading
    LLVM and nvJitLink and one small compilation. The shim calls it on its prestart thread while
    the app creates its CUDA context (arch 0: none known yet; ahead), or else before it starts
    compile threads, so that LLVM's and nvJitLink's exit-time destructors are registered before
    the shim's exit hook that waits for those threads. Ahead, it may decline (False: not done)
    when the app's last run compiled nothing; a compile thread then does it before its first
    job. Not with PROTEUS_ASYNC_COMPILATION=0, where the app's own thread would."""
    assert session._state is not None
    if ahead and session._state.config.async_compilation != "0" and not compiles_likely(_last_run()):
        session._state.warm_up_skipped = True
        session.trace("variants", "the app's last run compiled nothing: the compiler is not warmed up ahead")
        try:
            spec_mod.prepare_keys(session._state.config, session._state.driver_version or None)
        except Exception as exc:  # the first launch meets it again, and reports it per kernel
            session.trace("variants", f"preparing cache keys: {type(exc).__name__}: {exc}")
        return False
    try:
        if session._state.compiler is not None:  # it warms up by itself, while this thread goes on
            session._state.compiler.start(arch or WARM_UP_ARCH, session._state.config.for_kernel("proteus_warm_up"),
                                  session._state.driver_version or None)
            spec_mod.prepare_keys(session._state.config, session._state.driver_version or None)
            session.trace("variants", "compiler process started")
        else:
            ms = spec_mod.warm_up(arch or WARM_UP_ARCH, session._state.config, session._state.driver_version or None)
            session.trace("variants", f"compiler ready ({ms:.0f} ms)")
    except Exception as exc:  # a real compilation will meet it again and report it per kernel
        session.trace("variants", f"preparing the compiler: {type(exc).__name__}: {exc}")
    return True


def _run_key() -> str:
    assert session._state is not None
    return run_key([f.sha256 for t in session._state.tables for f in t.fatbins])


def _last_run() -> int | None:
    """How many variants the app's last run compiled, from its note in the disk cache."""
    assert session._state is not None
    if not session._state.last_run_read:
        disk = next((level for level in session._state.cache.levels if isinstance(level, StorageCache)), None)
        if disk is not None and session._state.tables:
            entry = disk.get(_run_key(), counted=False)
            if entry is not None and entry.kind == RUN_KIND:
                session._state.last_run = decode_run(entry.data)
        session._state.last_run_read = True
    return session._state.last_run


def compiled_this_run() -> int:
    """Variants compiled, or queued for a compile thread and not compiled, in this process."""
    assert session._state is not None
    return sum(s.specializations + len(s.queued) for s in session._state.stats)


def finish(counters: bytes = b"", trials: bytes = b"") -> None:
    """At exit, from the shim, with its per-kernel counters (protocol.COUNTERS) and its speed
    what it followed of each variant (protocol.VARIANT: speed.received keeps the verdicts and launches): upstream's
    end-of-run trace lines and the time trace (trace.at_exit); save the tracker's decisions no
    compile thread saved; note for the next run whether this one compiled, where that changes
    its guess (policy.compiles_likely): a steady run writes nothing."""
    try:
        if session._state is None or not session._state.tables or session._state.config.disable:
            return
        speed.received(trials)
        _trace_at_exit(counters)
        _save_policies()
        warm.note()
        compiled = compiled_this_run()
        if (compiled > 0) != compiles_likely(_last_run()):
            session._state.cache.put(Entry(_run_key(), RUN_KIND, 0, encode_run(compiled), {"kernel": "(the app's last run)"}),
                             enforce_cap=False)
    except Exception as exc:  # never into C
        session.trace("variants", f"noting the run: {type(exc).__name__}: {exc}")


def _trace_at_exit(counters: bytes) -> None:
    from .report import parse_counters

    st = session._state
    kernels, entries = [], []
    for kid, launches, table_hits, *_, name in parse_counters(counters):
        variants = st.stats[kid].variants if kid >= 0 else []
        kernels.append((st.stats[kid].demangled if kid >= 0 else name, len(variants), launches))
        # upstream's in-memory cache entries: per variant its launches, the first a miss
        entries += [(compat.hash_value(v["cache_key"]), v["launches"], v["launches"] - 1) for v in variants if v.get("launches")]
    disk = st.cache.stats().get("disk")
    trace.at_exit(st.config, kernels, (sum(e[2] for e in entries), sum(e[1] for e in entries)),
                  (disk.hits, disk.hits + disk.misses) if disk is not None else (0, 0), entries)


def load_failed(kid: int, code: int) -> None:
    assert session._state is not None
    record = session._state.kernels[kid][1]
    reason = (f"hipModuleLoadData/hipModuleGetFunction failed with HIP error {code}" if isinstance(record.arch, str)
              else f"cuModuleLoadData/cuModuleGetFunction failed with CUDA error {code}")
    stats = session._state.stats[kid]
    stats.failures[reason] = stats.failures.get(reason, 0) + 1
    session.warn_once(f"load:{record.name}", f"{record.demangled}: {reason}; running the original kernel")


