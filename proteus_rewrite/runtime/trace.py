"""What a run prints while it specializes (PROTEUS_TRACE_OUTPUT, PROTEUS_ENABLE_TIMERS) and the
time trace it writes at exit (PROTEUS_ENABLE_TIME_TRACE).

Upstream Proteus's tokens print upstream's lines (compat.py formats them, so that upstream's
FileCheck expectations hold), on the app's stdout as upstream prints them: through the C
library's stdout, so that they interleave with the app's own printf output in order. This
project's own, richer lines have tokens of their own ("variants", "launches") and go to stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

from .. import compat

_libc = None
_stdout = None
_events: list[compat.TraceEvent] = []  # the time trace, when enabled (module-level: one per process)
_events_lock = threading.Lock()
_begin_us = int(time.perf_counter() * 1e6)


def upstream(line: str) -> None:
    """One of upstream's lines, on the C library's stdout."""
    global _libc, _stdout
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
            _stdout = ctypes.c_void_p.in_dll(_libc, "stdout")
        _libc.fputs((line + "\n").encode(), _stdout)
        _libc.fflush(_stdout)
    except (OSError, ValueError, AttributeError):  # no C stdout to speak of: Python's will do
        print(line, flush=True)


def ours(config, token: str, message: str) -> None:
    if token in config.trace:
        print(f"proteus: {message}", file=sys.stderr, flush=True)


def specialization(config, cg, record, result, block, grid, raw_args) -> None:
    """Upstream's lines for one variant compiled (PROTEUS_TRACE_OUTPUT=specialization; a disk
    cache hit prints the hit alone, as upstream's persistent cache does) and its timers
    (PROTEUS_ENABLE_TIMERS)."""
    if "specialization" in config.trace:
        if result.source == "disk":
            upstream(compat.cache_hit_line(compat.hash_value(result.key)))
        elif result.source == "compiled":
            lines = [compat.kernel_config_line(record.name, cg)]
            lines += compat.arg_spec_lines(record.name, {i: raw_args[i] for i in result.plan.folded},
                                           {i: record.params[i].llvm_type or "" for i in result.plan.folded})
            # the compiler's count of the calls it folded (the IR is kept only with ir-dump)
            calls = result.sreg_calls or compat.sreg_calls(result.ir_text or "")
            if cg.specialize_dims:
                lines += compat.dim_spec_lines(tuple(grid), tuple(block), calls)
            if cg.specialize_dims_range:
                lines += compat.dim_range_lines(tuple(grid), tuple(block), calls)
            if cg.specialize_launch_bounds and result.plan.max_threads:
                threads = block[0] * block[1] * block[2]
                lines.append(compat.launch_bound_line(threads, compat.upstream_min_blocks(
                    cg.tuned_max_threads, cg.min_blocks_per_sm, threads)))
            if cg.opt_pipeline:
                lines.append(compat.custom_pipeline_line(cg.opt_pipeline))
            for line in lines:
                upstream(line)
    if config.enable_timers and result.source == "compiled":
        t = result.timings_ms
        upstream(compat.timer_line("specializeIR", t.get("ir", 0.0)))
        upstream(compat.optimize_timer_line(cg.opt_level, cg.opt_pipeline, cg.codegen_opt_level, t.get("optimize", 0.0)))
        upstream(compat.timer_line("Codegen ptx", t.get("ptx", t.get("object", 0.0))))
        upstream(compat.timer_line("Codegen object", t.get("cubin", t.get("link", 0.0))))


def event(config, name: str, start_s: float, seconds: float, detail: str = "") -> None:
    """A span of the time trace (perf_counter seconds), on the calling thread."""
    if not config.enable_time_trace:
        return
    e = compat.TraceEvent(name, int(start_s * 1e6) - _begin_us, int(seconds * 1e6), threading.get_native_id(), detail)
    with _events_lock:
        _events.append(e)


def at_exit(config, kernels: list[tuple[str, int, int]], memory: tuple[int, int], disk: tuple[int, int],
            entries: list[tuple[int, int, int]]) -> None:
    """Upstream's end-of-run lines: the memory cache (cache-stats), the kernel trace
    (kernel-trace: per kernel its variants and launches), the storage cache (cache-stats); then
    the time trace file."""
    rank = compat.distributed_rank(os.environ)
    if "cache-stats" in config.trace:
        for line in compat.memory_cache_lines(memory[0], memory[1], entries, rank=rank):
            upstream(line)
    if "kernel-trace" in config.trace:
        for line in compat.kernel_trace_lines(kernels, rank=rank):
            upstream(line)
    if "cache-stats" in config.trace and config.use_stored_cache:
        for line in compat.cache_chain_lines(disk[0], disk[1], rank=rank):
            upstream(line)
    if config.enable_time_trace:
        with _events_lock:
            doc = compat.chrome_trace(list(_events), config.time_trace_grain_us, os.getpid(), 0)
        try:
            from .files import atomic_write

            atomic_write(config.time_trace_path, json.dumps(doc).encode())
        except OSError as exc:
            print(f"proteus: warning: {config.time_trace_path}: cannot write the time trace: {exc.strerror or exc}",
                  file=sys.stderr, flush=True)
