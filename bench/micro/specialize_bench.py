"""Cold specialization time per kernel, split into IR / optimize / PTX / cubin, for every
sample kernel and each offline PTX compiler (target: median <= 50 ms per kernel).

    python -m bench.micro.specialize_bench [--repeat 5] [--compilers nvjitlink,ptxas]

"Cold" means no cache: every repetition builds the IR, optimizes, emits PTX and compiles
it. One warm-up specialization per compiler is not counted (it loads libraries). Writes
bench/results/specialize-<date>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from bench.lib.paths import RESULTS, SAMPLES_BUILD
from proteus_rewrite.fatbin import extract
from proteus_rewrite.jit import Config, Launch, specialize
from proteus_rewrite.jit.launch import parse_value

APPS = ["loop_count", "device_globals", "multi_kernel", "two_tu", "two_tu_rdc", "templates", "annotated"]
STAGES = ("ir", "optimize", "ptx", "cubin", "total")


def launch_for(kernel) -> Launch:
    raw = []
    for p in kernel.params:
        if p.kind == "pointer":
            raw.append((0x7F0000000000 + 0x100000 * p.index).to_bytes(8, "little"))
        elif p.kind in ("int", "float"):
            raw.append(parse_value(p, "1" if p.llvm_type == "i1" else "8"))
        else:
            raw.append(bytes(p.size))
    globals_ = {g: 0x7F00DEAD0000 + 0x1000 * i for i, g in enumerate(kernel.globals)}
    return Launch(tuple(raw), (1024, 1, 1), (128, 1, 1) if kernel.max_threads else (256, 1, 1), 90, globals_)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--compilers", default="nvjitlink,ptxas")
    ap.add_argument("--samples", default=str(SAMPLES_BUILD))
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args()

    kernels = []
    for app in APPS:
        t = extract(Path(args.samples) / app)
        kernels += [(app, t, k) for k in t.kernels if k.arch == 90]
    rows = []
    summary = {}
    for compiler in args.compilers.split(","):
        cfg = Config.from_env({"PROTEUS_PTX_COMPILER": compiler})
        app, t, k = kernels[0]
        specialize(t, k, launch_for(k), cfg)  # warm-up: library loading is not per-kernel cost
        totals = []
        for app, t, k in kernels:
            runs = [specialize(t, k, launch_for(k), cfg).timings_ms for _ in range(args.repeat)]
            med = {s: round(statistics.median(r[s] for r in runs), 2) for s in STAGES}
            rows.append({"compiler": compiler, "app": app, "kernel": k.demangled, **med})
            totals.append(med["total"])
        summary[compiler] = {"median_total_ms": round(statistics.median(totals), 2), "max_total_ms": round(max(totals), 2)}

    import llvmlite

    result = {
        "benchmark": "cold specialization time per kernel (no cache)",
        "command": "python -m bench.micro.specialize_bench " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "llvmlite": llvmlite.__version__},
        "repeat": args.repeat,
        "summary": summary,
        "target_median_ms": 50,
        "kernels": rows,
    }
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"specialize-{result['date']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")

    print("| compiler | app | kernel | IR ms | optimize ms | PTX ms | cubin ms | total ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['compiler']} | {r['app']} | `{r['kernel']}` | {r['ir']} | {r['optimize']} | {r['ptx']} | {r['cubin']} "
              f"| {r['total']} |")
    for c, s in summary.items():
        print(f"\n{c}: median {s['median_total_ms']} ms per kernel, max {s['max_total_ms']} ms")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
