"""What the shim's Python half adds to a process's exit, by how far it got: the time from just
before exit() (C's, as an app's return from main runs it: exit handlers, library destructors,
the kernel freeing the address space; no Python finalization, which the shim never runs) to
the parent seeing the child end.

    python -m bench.micro.exit_cost [--reps 15] [--out bench/results] [--tag T]

Stages: a bare interpreter; proteus_rewrite.runtime imported (what a warm run loads); LLVM
loaded with a target machine; the compiler warmed up (specializer.warm_up: LLVM, nvJitLink and
one small compilation, what the shim's prestart thread does ahead of the first launch). Writes
bench/results/exitcost-<date>-<host>.json and prints a markdown table. CPU only: nvJitLink
needs no GPU.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

from bench.lib import provenance as suite  # the results files' header
from bench.lib.paths import ROOT

STAGES = ("bare interpreter", "runtime imported", "LLVM target machine", "compiler warmed up")
CHILD = r"""
import ctypes, resource, sys, time
stage = int(sys.argv[1])
if stage >= 1:
    import proteus_rewrite.runtime
if stage >= 2:
    from proteus_rewrite.jit import ir
    ir.any_target_machine()
if stage >= 3:
    from proteus_rewrite.jit import specializer
    specializer.warm_up(proteus_rewrite.runtime.WARM_UP_ARCH)  # as the prestart thread: arch 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stdout.write(f"{time.monotonic_ns()} {rss}\n")
sys.stdout.flush()
ctypes.CDLL(None).exit(0)
"""


def one(stage: int) -> tuple[float, int]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(stage)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT)
    line = proc.stdout.readline()
    proc.wait()
    end = time.monotonic_ns()  # CLOCK_MONOTONIC, as the child's
    if proc.returncode != 0 or not line:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"stage {STAGES[stage]!r}: exit {proc.returncode}: {err[-1] if err else 'no output'}")
    t0, rss_kb = map(int, line.split())
    return (end - t0) / 1e6, rss_kb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="processes per stage (default 15)")
    suite.cpu_arguments(ap)
    args = ap.parse_args(argv)
    if args.reps < 1:
        print("exit_cost: --reps must be positive", file=sys.stderr)
        return 2
    rows = {}
    for stage, name in enumerate(STAGES):
        times, rss = [], 0
        try:
            for _ in range(args.reps):
                ms, rss = one(stage)
                times.append(round(ms, 3))
        except RuntimeError as exc:
            print(f"exit_cost: {exc}", file=sys.stderr)
            return 1
        rows[name] = {"exit_ms_median": round(statistics.median(times), 2), "exit_ms_min": min(times),
                      "max_rss_mb": round(rss / 1024), "exit_ms": times}
        print(f"exit_cost: {name}: {rows[name]['exit_ms_median']} ms", file=sys.stderr)
    doc = suite.cpu_results("exit cost", "bench.micro.exit_cost", argv, python=platform.python_version(), reps=args.reps, stages=rows)
    suite.publish_cpu_results(doc, args, "exitcost", "exit_cost", ["stage", f"exit ms (median of {args.reps})", "min", "max RSS MB"],
                              [[name, r["exit_ms_median"], r["exit_ms_min"], r["max_rss_mb"]] for name, r in rows.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
