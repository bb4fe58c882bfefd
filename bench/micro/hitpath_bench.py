"""The shim's hit path on the CPU (bench/micro/hitpath.c): pick() for a launch its table serves,
without the driver, for a few key shapes: back to back, and with megabytes written between
two launches, as the driver's launch call and the app's work do in a real run.

    python -m bench.micro.hitpath_bench [--iterations 5000000] [--shim DIR] [--out bench/results] [--tag T]

Builds bench/micro/hitpath.c from the shim/ sources (or DIR/: another version of
the shim, to compare) with the shim's flags, runs each shape (the median of five timings) and
writes bench/results/hitpath-<date>-<host>.json, printing a markdown table.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.lib import provenance as suite  # the results files' header
from bench.lib.paths import ROOT

HERE = Path(__file__).resolve().parent
SHAPES = {  # name: folded arguments, bytes each, dims in the key (bit 0 block, bit 1 grid), KiB evicted per launch,
    # and whether the variant is still compiling (the launch runs the original through await_variant)
    "changing_scalars (2 folded i32, block and grid)": (2, 4, 3, 0, 0),
    "nothing folded, block only": (0, 4, 1, 0, 0),
    "8 folded 8-byte, block and grid": (8, 8, 3, 0, 0),
    "24 folded 8-byte, block and grid": (24, 8, 3, 0, 0),
    # as in an app: the driver's launch call and the app's work between two hits (hitpath.c)
    "changing_scalars, 1 MiB written between launches": (2, 4, 3, 1024, 0),
    "changing_scalars, 4 MiB written between launches": (2, 4, 3, 4096, 0),
    "changing_scalars, 16 MiB written between launches": (2, 4, 3, 16384, 0),
    # a cold run's launches until their variant arrives
    "changing_scalars, variant compiling, 1 MiB between launches": (2, 4, 3, 1024, 1),
    "changing_scalars, variant compiling, 16 MiB between launches": (2, 4, 3, 16384, 1),
}
EVICTING_ITERATIONS = 20_000  # each launch writes megabytes: fewer of them


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=5_000_000, help="hits per timing (default 5,000,000)")
    ap.add_argument("--shim", type=Path, default=ROOT / "shim", help="the shim sources to build against (default shim/)")
    suite.cpu_arguments(ap)
    args = ap.parse_args(argv)
    if not (args.shim / "cuda.c").is_file():
        print(f"hitpath_bench: {args.shim}: no cuda.c there (the shim's sources)", file=sys.stderr)
        return 2
    if args.iterations < 1:
        print("hitpath_bench: --iterations must be positive", file=sys.stderr)
        return 2
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("hitpath_bench: no C compiler (cc or gcc) on PATH", file=sys.stderr)
        return 2
    rows = {}
    with tempfile.TemporaryDirectory(prefix="proteus-hitpath-") as tmp:
        exe = Path(tmp) / "hitpath"
        from proteus_rewrite.inject.shim import SOURCES  # the shim's own list: hitpath.c includes cuda_launch.c

        others = [str(args.shim / n) for n in SOURCES if n not in ("cuda_launch.c", "hip.c")]
        build = subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-I", str(args.shim), str(HERE / "hitpath.c"),
                                *others, "-o", str(exe), "-ldl", "-lpthread"], capture_output=True, text=True)
        if build.returncode != 0:
            print(f"hitpath_bench: bench/micro/hitpath.c does not build: {build.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        for name, (folded, size, dims, evict_kb, compiling) in SHAPES.items():
            iterations = min(args.iterations, EVICTING_ITERATIONS) if evict_kb else args.iterations
            proc = subprocess.run([str(exe), str(iterations), str(folded), str(size), str(dims), str(evict_kb), str(compiling)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"hitpath_bench: {name}: {proc.stderr.strip() or f'exit {proc.returncode}'}", file=sys.stderr)
                return 1
            times = [float(ln.split()[1]) for ln in proc.stdout.splitlines() if ln.startswith("ns_per_hit ")]
            key = next(int(ln.split()[1]) for ln in proc.stdout.splitlines() if ln.startswith("key_bytes "))
            rows[name] = {"ns_per_hit": round(statistics.median(times), 1), "timings": times, "key_bytes": key,
                          "iterations": iterations, "evicted_kib_per_launch": evict_kb,
                          "variant_compiling": bool(compiling)}
    doc = suite.cpu_results("hitpath", "bench.micro.hitpath_bench", argv, iterations=args.iterations, shim=str(args.shim),
                            compiler=subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
                            shapes=rows)
    suite.publish_cpu_results(doc, args, "hitpath", "hitpath_bench", ["key shape", "key bytes", "ns per hit (median of 5)"],
                              [[name, r["key_bytes"], r["ns_per_hit"]] for name, r in rows.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
