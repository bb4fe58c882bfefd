"""The run's report (PROTEUS_REPORT): written at exit from the shim's counters and the run
time's statistics, read back by `proteus-rewrite report` and `prewarm`. Its schema is here
alone: write_report makes the document, read_report checks one and gives its kernels, and
LaunchRecord is a variant's launch, the one part of it that is read back field by field (by
prewarm, and by warm.py from this run's statistics)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, jobenv
from ..errors import InputError
from ..fatbin.table import KernelRecord
from ..jit.launch import Launch
from ..jit.targets import document_arch
from ..policy import BLOCK, GRID
from . import protocol, speed, validate
from .files import atomic_write
from .launch import RawLaunch
from .session import Session


def _wait_sections(waits: tuple[int, ...]) -> dict:
    """The report's shim_wait_ms, threads_ms, timeline_ns and prestart from the shim's figures."""
    if len(waits) != len(protocol.WAIT_FIELDS):
        return {"shim_wait_ms": {}, "prestart": {}}
    w = dict(zip(protocol.WAIT_FIELDS, waits))

    def ms(ns: int) -> float:
        return round(ns / 1e6, 2)

    start, end, report = w["main_start"], w["main_end"], w["report"]
    return {
        # what the app's threads spent waiting on the shim: never a hit, only misses and exit;
        # compiling: launches that waited for their variant to finish compiling (auto mode);
        # miss_stages: the compile lock, a kernel's first launch, the value tracker, the caches
        # (or, compiling there, the compilation), queueing, and apart, before the tracker and the
        # caches, waiting for the GIL (held by a compile or the prestart thread), and, taken out
        # of the caches' share, the driver loading the variant (CUDA); compiling_checks: launches that
        # asked again for a variant still compiling, found their stream idle and ran the original
        "shim_wait_ms": {"python_start": ms(w["python_start"]), "misses": ms(w["misses"]), "miss_count": w["miss_count"],
                         "prepare_compiler": ms(w["prepare_compiler"]), "exit": ms(w["exit"]),
                         "compiling": ms(w["compiling"]), "compiling_count": w["compiling_count"],
                         "miss_stages": {f: ms(w[f]) for f in protocol.MISS_STAGES},
                         "compiling_checks": ms(w["compiling_checks"]),
                         "compiling_check_count": w["compiling_check_count"],
                         # of miss_count, launches handed to the tracker later, with no Python call
                         "deferred_count": w["deferred_count"],
                         # the variants' checks (PROTEUS_VALIDATE): their time as the budget counts it,
                         # how many ended, and where it went (protocol.CHECK_PHASES)
                         "checks": {"ms": ms(w["checks"]), "count": w["check_count"],
                                    "phases": {p: ms(w[f"check_{p}"]) for p in protocol.CHECK_PHASES}}},
        # where the CPU went: the app's main() against the shim's own threads, and what came
        # between main's return and this report (exit handlers, destructors)
        "threads_ms": {"app_main_wall": ms(end - start) if start and end else 0.0, "app_main_cpu": ms(w["app_main_cpu"]),
                       "compile_threads_cpu": ms(w["compile_threads_cpu"]), "prestart_cpu": ms(w["prestart_cpu"]),
                       "after_main": ms(report - end) if end else 0.0},
        # the same instants on a parent's clock: a benchmark places them in its run
        "timeline_ns": {f: w[f] for f in ("shim_loaded", "main_start", "main_end", "report")},
        # what the shim's prestart thread did before the first launch (PROTEUS_PRESTART)
        "prestart": {"python": bool(w["prestart"] & 1), "compiler": bool(w["prestart"] & 2),
                     # variants of the last run's launches loaded before their first launch (runtime/warm.py)
                     "variants_loaded": w["preloaded"]},
    }


def parse_counters(counters: bytes) -> list[tuple]:
    """The shim's per-kernel counters (protocol.COUNTERS, then the name): one tuple each,
    COUNTER_FIELDS then the name."""
    out, off = [], 0
    while off + protocol.COUNTERS.size <= len(counters):
        fields = protocol.COUNTERS.unpack_from(counters, off)
        end = counters.index(b"\0", off + protocol.COUNTERS.size)
        out.append((*fields, counters[off + protocol.COUNTERS.size : end].decode(errors="replace")))
        off = end + 1
    return out


@dataclass(frozen=True)
class LaunchRecord:
    """A variant's launch as the report records it (each variant's "launch", and each of a
    kernel's "not_compiled"): enough to compile the variant again offline (prewarm) and to note
    it for the next run to load ahead (warm.py). to_json writes it; from_json is its one reader."""

    args: tuple[tuple[int, bytes], ...]  # the folded parameters' bytes, by index, ascending
    unknown_dims: tuple[str, ...]  # BLOCK, GRID: not folded, not bounding the kernel
    arch: int | str  # the device's (a CUDA record's may be older)
    block: tuple[int, ...]
    grid: tuple[int, ...]
    globals: tuple[tuple[str, int], ...]  # device variable -> its address in the AOT module

    @classmethod
    def of(cls, launch: RawLaunch, folded, unknown_dims, arch: int | str, record: KernelRecord) -> LaunchRecord:
        """The record of `launch` (of `record`'s kernel), keeping the arguments in `folded`."""
        return cls(tuple((i, launch.args[i]) for i in sorted(folded)), tuple(sorted(unknown_dims)), arch,
                   tuple(launch.block), tuple(launch.grid), tuple(zip(record.globals, launch.addresses)))

    def to_json(self) -> dict:
        return {"args": {str(i): v.hex() for i, v in self.args}, "unknown_dims": list(self.unknown_dims),
                "arch": self.arch, "block": list(self.block), "grid": list(self.grid), "globals": dict(self.globals)}

    @classmethod
    def from_json(cls, doc: object) -> LaunchRecord:
        """A launch record read back; ValueError, TypeError, KeyError or AttributeError (with
        what is wrong) when `doc` is not one."""
        if not isinstance(doc, dict):
            raise TypeError("not an object")
        if not isinstance(doc["args"], dict):
            raise TypeError("its args are not an object")
        args = tuple(sorted((int(i), bytes.fromhex(v)) for i, v in doc["args"].items()))
        dims = doc.get("unknown_dims", [])
        if not isinstance(dims, list) or not all(isinstance(d, str) for d in dims):
            raise TypeError("its unknown_dims are not a list of names")
        arch = document_arch(doc["arch"])
        grid, block = tuple(doc.get("grid") or ()), tuple(doc.get("block") or ())
        if not all(len(d) == 3 and all(isinstance(v, int) and v > 0 for v in d) for d in (grid, block)):
            raise ValueError("grid and block need three positive integers each")
        globals_ = tuple((str(g), int(a)) for g, a in doc.get("globals", {}).items())
        return cls(args, tuple(sorted(dims)), arch, block, grid, globals_)

    def without(self, slots) -> LaunchRecord:
        """This launch with the tracker's stopped slots (argument indices as text, BLOCK,
        GRID) unfolded: the launch the next run asks for."""
        slots = {str(s) for s in slots}
        if not slots:
            return self
        return dataclasses.replace(self, args=tuple((i, v) for i, v in self.args if str(i) not in slots),
                                   unknown_dims=tuple(sorted({*self.unknown_dims, *(slots & {BLOCK, GRID})})))

    def launch(self, record: KernelRecord) -> Launch:
        """The launch to specialize `record` for: a parameter the record leaves out is zero,
        and unknown (never folded)."""
        args = dict(self.args)
        return Launch(tuple(args.get(p.index, bytes(p.size)) for p in record.params), self.grid, self.block, self.arch,
                      dict(self.globals), frozenset(p.index for p in record.params if p.index not in args),
                      frozenset(self.unknown_dims))


def write_report(session: Session, path: str, counters: bytes, unknown_launches: int = 0,
                 waits: tuple[int, ...] = ()) -> None:
    """PROTEUS_REPORT: per kernel, launches, specialized launches, variants, cache hits, compile ms, fallbacks.
    `waits`, from the shim: WAIT_FIELDS, in that order (ns, counts, CLOCK_MONOTONIC times).
    Without them (a test), the report has no waits. `path` is PROTEUS_REPORT's value: `%r` in it
    becomes the job rank (the pid without one), `%p` the pid (jobenv.expand_path)."""
    t_report = time.perf_counter()
    path = jobenv.expand_path(path)
    if session.profile is not None:
        session.profile.disable()
        try:
            session.profile.dump_stats(os.environ["PROTEUS_PROFILE"])
        except OSError as exc:
            print(f"proteus: warning: {os.environ['PROTEUS_PROFILE']}: cannot write the profile: {exc.strerror or exc}",
                  file=sys.stderr, flush=True)
    kernels = []
    for kid, launches, hits, fallbacks, launch_errors, compiling, captured, timing, gpu_us, graph_nodes, awaiting, name in \
            parse_counters(counters):
        # a launch into a stream capture ran nothing: its graph's node runs what the
        # instantiation chose for it (graph_nodes_specialized counts the nodes given a variant)
        entry = {"name": name, "launches": launches,
                 "fallback_launches": fallbacks + launch_errors + compiling + timing + awaiting,
                 "launch_errors": launch_errors, "launches_while_compiling": compiling, "launches_captured": captured,
                 "graph_nodes_specialized": graph_nodes,
                 # the original's turns in the speed trials of new variants (runtime/speed.py)
                 "launches_timing_original": timing,
                 # the original ran while a new variant waited for its check (PROTEUS_VALIDATE's budget)
                 "launches_awaiting_check": awaiting,
                 "gpu_ms_estimate": round(gpu_us / 1000.0, 3)}
        if kid >= 0:
            s = session.stats[kid]
            entry.update(
                demangled=s.demangled,
                globals=list(session.kernels[kid][1].globals),
                specialized_launches=launches - fallbacks - launch_errors - compiling - captured - timing - awaiting,
                table_hits=hits,
                specializations=s.specializations,
                memory_cache_hits=s.memory_hits,
                disk_cache_hits=s.disk_hits,
                compile_ms=round(s.compile_ms, 2),
                failures=s.failures,
                variants=s.variants,
                # queued for a compile thread but not compiled when the run ended (prewarm compiles them)
                not_compiled=list(s.queued.values()),
                budget_refusals=s.budget_refusals,
                # speed trials: the variants' GPU time over the original's (geometric mean; below 1
                # they won), and variants an earlier run found slower, whose launches ran the original
                kernel_time_vs_original=speed.kernel_ratio(s.variants),
                slower_declined=s.slower_declined,
            )
            if s.tracker is not None:
                record = session.kernels[kid][1]
                entry["tracker"] = {"distinct_variants": s.tracker.variants, "stopped_folding": s.tracker.dropped,
                                    "learned_from_earlier_runs": s.tracker.learned,
                                    "folded_now": [record.params[i].index for i in sorted(s.tracker.folded)],
                                    "dims_now": [d for d, bit in ((BLOCK, 1), (GRID, 2)) if s.tracker.dims & bit]}
        else:
            entry.update(specialized_launches=0, failures={"not specialized": fallbacks + captured})
        kernels.append(entry)
    doc = {
        "tool": f"proteus-rewrite {__version__}",
        "pid": os.getpid(),
        "rank": jobenv.rank(),  # from the launcher's environment (jobenv.RANK_VARIABLES); null outside a job
        "driver_version": session.driver_version,
        "unknown_handle_launches": unknown_launches,  # launches of kernels the shim never saw registered
        "async_compilation": session.config.async_compilation,
        "async_threads": session.config.async_threads,
        "seconds": round(time.time() - session.started, 3),
        **_wait_sections(waits),
        "stores": [t.app.name for t in session.tables],
        "cache": {name: vars(s) for name, s in session.cache.stats().items()},
        # the shared tier's compile claims (PROTEUS_CACHE_SHARED): won, lost, broken, wait_s,
        # shared_hits, write_failures (cache.CacheChain.claim_stats); {} where the cache keeps none
        "claims": claim_counters(getattr(session.cache, "claim_stats", {})),
        # where variants compile: a process of its own (None: in the app's, PROTEUS_COMPILE_PROCESS=0)
        "compiler_process": session.compiler.report() if session.compiler is not None else None,
        "kernels": kernels,
    }
    if session.validation:  # PROTEUS_VALIDATE: each variant checked against the original
        doc["validation"] = validate.report_section(session)
    if doc["prestart"]:  # left cold ahead: the app's last run compiled nothing (policy.compiles_likely)
        doc["prestart"]["compiler_skipped"] = session.warm_up_skipped
    if "threads_ms" in doc:   # this report's own cost, up to writing it (a cold run's is larger)
        doc["threads_ms"]["report"] = round((time.perf_counter() - t_report) * 1e3, 2)
    try:
        atomic_write(path, json.dumps(doc, indent=2).encode())
    except OSError as exc:
        print(f"proteus: warning: {path}: cannot write the report: {exc.strerror or exc}", file=sys.stderr, flush=True)


def claim_counters(stats: object) -> dict:
    """The cache chain's claim_stats as plain JSON numbers, whatever holds them (a dict, a
    dataclass, an object with attributes); what is not a number is left out."""
    if callable(stats):  # a method, not a property
        stats = stats()
    if stats is None:
        return {}
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        stats = dataclasses.asdict(stats)
    elif not isinstance(stats, dict):
        stats = getattr(stats, "__dict__", {})
    return {str(k): v for k, v in stats.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not str(k).startswith("_")}


@dataclass
class KernelRow:
    """One kernel of a report, as `proteus-rewrite report` shows it."""

    kernel: str
    launches: int
    specialized: int
    compiled: int
    memory_hits: int
    disk_hits: int
    compile_ms: float
    while_compiling: int
    budget_refusals: int
    fallbacks: int
    failures: dict[str, int] = field(default_factory=dict)
    unfolded_by_tracker: list = field(default_factory=list)
    not_compiled: int = 0
    time_vs_original: float | None = None  # speed trials: the variants' GPU time over the original's
    slower: int = 0  # variants found slower than the original (this run or an earlier one)
    verdict: str = "-"  # speed trials, in words: faster, slower (dropped) or not yet judged, and why
    checks: str = "-"  # PROTEUS_VALIDATE's checks, in words: same, denied, unchecked (why), waiting


def read_report(path: str) -> dict:
    """A PROTEUS_REPORT document, checked to be one (one-line InputErrors otherwise)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    except ValueError as exc:
        raise InputError(f"not a PROTEUS_REPORT file (not JSON: {exc})", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("kernels"), list):
        raise InputError("not a PROTEUS_REPORT file (no kernel list)", path)
    return doc


def kernel_rows(doc: dict, path: str) -> list[KernelRow]:
    try:
        rows = []
        for k in doc["kernels"]:
            tracker = k.get("tracker") or {}
            rows.append(KernelRow(
                kernel=k.get("demangled") or k["name"], launches=int(k.get("launches", 0)),
                specialized=int(k.get("specialized_launches", 0)), compiled=int(k.get("specializations", 0)),
                memory_hits=int(k.get("memory_cache_hits", 0)), disk_hits=int(k.get("disk_cache_hits", 0)),
                compile_ms=float(k.get("compile_ms", 0.0)), while_compiling=int(k.get("launches_while_compiling", 0)),
                budget_refusals=int(k.get("budget_refusals", 0)), fallbacks=int(k.get("fallback_launches", 0)),
                failures=dict(k.get("failures") or {}), unfolded_by_tracker=list(tracker.get("stopped_folding", [])),
                not_compiled=len(k.get("not_compiled") or []),
                time_vs_original=k.get("kernel_time_vs_original"),
                slower=len(k.get("slower_declined") or []) + sum(
                    1 for v in k.get("variants") or [] if (v.get("speed") or {}).get("verdict") == "slower"),
                verdict=trial_verdict(k), checks=check_verdict(k)))
        return rows
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"not a PROTEUS_REPORT file ({type(exc).__name__}: {exc})", path) from None


def check_verdict(kernel: dict) -> str:
    """What PROTEUS_VALIDATE's checks said of a kernel's variants, in words: how many matched the
    original, how many ran unchecked and why (it could not be compared), how many waited (the
    run's budget, or the run ended first: a later run checks them), and a denial."""
    counts: dict[str, int] = {}
    reasons: list[str] = []
    for v in kernel.get("variants") or []:
        check = v.get("check") if isinstance(v.get("check"), dict) else None
        if check is None:
            continue
        verdict = str(check.get("verdict"))
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict == "unchecked" and check.get("reason") and check["reason"] not in reasons:
            reasons.append(str(check["reason"]))
    parts = [f"{counts[k]} {word}" for k, word in (("same", "matched"), ("within-ulps", "within the ULPs allowed"))
             if counts.get(k)]
    if counts.get("unchecked"):
        parts.append(f"{counts['unchecked']} ran unchecked ({'; '.join(reasons)})" if reasons
                     else f"{counts['unchecked']} ran unchecked")
    waiting = counts.get("pending", 0)
    if waiting or kernel.get("launches_awaiting_check"):
        n = kernel.get("launches_awaiting_check", 0)
        parts.append(f"{waiting} not checked yet (a later run checks them)" + (f", {n:,} launches ran the original meanwhile"
                                                                               if n else ""))
    if counts.get("differs"):
        parts.append("denied: a variant wrote different results")
    return "; ".join(parts) or "-"


def trial_verdict(kernel: dict) -> str:
    """What the speed trials said of a kernel's variants, in words: how many were kept (faster,
    or no slower than the margin), how many were found slower and dropped, how many are not yet
    judged and why (the timed launches so far, to which later runs add theirs; a variant ready
    after the kernel's last launch was never timed), and those judged by an earlier run."""
    kept, slower, open_, earlier = [], len(kernel.get("slower_declined") or []), [], 0
    for v in kernel.get("variants") or []:
        speed = v.get("speed") if isinstance(v.get("speed"), dict) else None
        if speed is None:
            continue
        if speed.get("remembered"):
            earlier += 1
        verdict = speed.get("verdict")
        if verdict == "kept":
            kept.append(speed.get("variant_over_original"))
        elif verdict == "slower":
            slower += 1
        elif verdict == "undecided":
            open_.append(int(speed.get("timed_launches") or 0))
    parts = []
    if kept:
        ratios = [r for r in kept if r]
        parts.append(f"{len(kept)} kept" + (f" ({min(ratios):.2f}-{max(ratios):.2f}x)" if len(ratios) > 1
                                            else f" ({ratios[0]:.2f}x)" if ratios else ""))
    if slower:
        parts.append(f"{slower} slower, dropped")
    started = [n for n in open_ if n]
    if started:
        most = max(started)
        parts.append(f"{len(started)} not judged yet: {'at most ' if len(started) > 1 else ''}"
                     f"{most} timed launch{'es' if most != 1 else ''} so far, later runs add theirs")
    if len(started) < len(open_):
        parts.append(f"{len(open_) - len(started)} not timed: no launch ran it once it was ready")
    if earlier:
        parts.append(f"{earlier} judged by an earlier run")
    return "; ".join(parts) or "-"
