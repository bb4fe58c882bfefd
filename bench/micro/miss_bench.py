"""What a miss costs the launching thread in the shim's Python half, CPU only: a launch of
changing_scalars' step-counter kernel whose key the shim's table lacks, asked the way the shim
asks it on the launching thread before it queues a compilation (the value tracker, then the
caches only), with each launch a new counter value (the tracker keeps folding it: T is set
out of reach) and an empty disk cache.

    python -m bench.micro.miss_bench [--reps 5] [--misses 300] [--out bench/results] [--tag T]

Shapes: "two calls": runtime.track, the GIL let go (as the shim's C code does between two
calls), runtime.specialize(cached_only=1); "one call": runtime.miss (which earlier versions lack:
run on one, this script measures "two calls" only, --shapes "two calls"). Conditions, each in a fresh interpreter: "alone", and
"during the warm-up": while another thread runs runtime.prepare_compiler (loading LLVM and
nvJitLink and one small compilation, what the shim's prestart thread does beside the app's
CUDA context creation, and where a cold run's first launches land on the H100), misses until
it ends. Writes bench/results/miss-<date>-<host>[-tag].json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.lib import provenance as suite  # the results files' header
from bench.lib.paths import ROOT, SAMPLES_BUILD

SAMPLE = SAMPLES_BUILD / "changing_scalars"
KERNEL = "_Z15accumulate_stepPjiij"
SHAPES = ("two calls", "one call")
CONDITIONS = ("alone", "during the warm-up")
CHILD = r"""
import ctypes, json, os, struct, sys, threading, time
store, fatbin, shape, condition, limit = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
from proteus_rewrite import runtime
data = open(fatbin, "rb").read()
buf = ctypes.create_string_buffer(data, len(data))
assert runtime.init(store, 13000)
kid = struct.unpack_from("<I", runtime.kernel_info(ctypes.addressof(buf), sys.argv[6], 90))[0]
runtime.state().stats[kid].tracker.threshold = 1 << 30  # keep folding the counter: every launch a new variant
grid, block = (16, 1, 1), (256, 1, 1)
done = threading.Event()
warm_up = threading.Thread(target=lambda: (runtime.prepare_compiler(0, 0), done.set()))
if condition == "during the warm-up":
    warm_up.start()
times = []
while len(times) < limit and not (condition == "during the warm-up" and done.is_set()):
    time.sleep(0.0001)  # the app's launches between misses: the GIL is free
    args = struct.pack("<Qiii", 0x7F0000000000, 4096, len(times), 12345)
    t0 = time.perf_counter_ns()
    if shape == "one call":
        runtime.miss(kid, args, grid, block, b"", 90, 0.0, 1)
    else:
        runtime.track(kid, args, grid, block)
        time.sleep(0)  # the GIL let go between the two calls, as the C side does
        runtime.specialize(kid, args, grid, block, b"", 90, 0.0, 1)
    times.append(time.perf_counter_ns() - t0)
if warm_up.is_alive():
    warm_up.join()
print(json.dumps(times))
"""


def one(store: str, fatbin: str, shape: str, condition: str, misses: int, cache: str) -> list[float]:
    env = {**os.environ, "PROTEUS_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, store, fatbin, shape, condition, str(misses), KERNEL],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0 or not proc.stdout.strip():
        err = proc.stderr.strip().splitlines()
        raise RuntimeError(f"{shape}, {condition}: exit {proc.returncode}: {err[-1] if err else 'no output'}")
    return [ns / 1e6 for ns in json.loads(proc.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="processes per shape and condition (default 5)")
    ap.add_argument("--misses", type=int, default=300, help="misses per process, alone (default 300)")
    ap.add_argument("--shapes", default=";".join(SHAPES), help="';'-separated (default: both)")
    suite.cpu_arguments(ap)
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(";") if s]
    if args.reps < 1 or args.misses < 1:
        print("miss_bench: --reps and --misses must be positive", file=sys.stderr)
        return 2
    if bad := [s for s in shapes if s not in SHAPES]:
        print(f"miss_bench: unknown shape {bad[0]!r} (expected {' or '.join(SHAPES)})", file=sys.stderr)
        return 2
    if not SAMPLE.is_file():
        print(f"miss_bench: {SAMPLE}: not built (python3 samples/build.py)", file=sys.stderr)
        return 1
    from proteus_rewrite.fatbin import hostelf

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "out"
        proc = subprocess.run([sys.executable, "-m", "proteus_rewrite", str(SAMPLE), "-o", str(store)],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"miss_bench: recording {SAMPLE}: {proc.stderr.strip()}", file=sys.stderr)
            return 1
        fatbin = Path(tmp) / "fatbin"
        fatbin.write_bytes(hostelf.parse(SAMPLE.read_bytes()).sections[hostelf.CUDA_FATBIN].data)
        rows = {}
        for shape in shapes:
            for condition in CONDITIONS:
                per_process, all_ms = [], []
                try:
                    for rep in range(args.reps):
                        ms = one(str(store), str(fatbin), shape, condition, args.misses, str(Path(tmp) / f"cache-{rep}"))
                        per_process.append({"misses": len(ms), "median_ms": round(statistics.median(ms), 4),
                                            "sum_ms": round(sum(ms), 3), "max_ms": round(max(ms), 3)})
                        all_ms += ms
                except RuntimeError as exc:
                    print(f"miss_bench: {exc}", file=sys.stderr)
                    return 1
                rows[f"{shape}, {condition}"] = {
                    "misses": len(all_ms), "median_ms": round(statistics.median(all_ms), 4),
                    "mean_ms": round(statistics.mean(all_ms), 4), "p90_ms": round(sorted(all_ms)[int(0.9 * len(all_ms))], 4),
                    "max_ms": round(max(all_ms), 3), "processes": per_process}
                print(f"miss_bench: {shape}, {condition}: median {rows[f'{shape}, {condition}']['median_ms']} ms",
                      file=sys.stderr)
    doc = suite.cpu_results("miss cost", "bench.micro.miss_bench", argv, python=platform.python_version(), reps=args.reps,
                            misses=args.misses, rows=rows)
    suite.publish_cpu_results(doc, args, "miss", "miss_bench", ["shape, condition", "misses", "median ms", "mean ms", "p90 ms", "max ms"],
                              [[name, *(r[f] for f in ("misses", "median_ms", "mean_ms", "p90_ms", "max_ms"))]
                               for name, r in rows.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
