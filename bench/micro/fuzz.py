"""Long fuzzing run of the binary parsers (the CI run, tests/cpu/test_fuzz.py, is short).

    python -m bench.micro.fuzz [--per-target 12000] [--hang-seconds 5]

Each target (bench/lib/fuzz_targets.py) gets --per-target inputs from hypothesis: real sample
bytes mutated, plus generated structures. An input either parses, or is rejected with a
ProteusError that has a one-line message; any other exception is a crash, and an input
that takes longer than --hang-seconds is a hang. Writes bench/results/fuzz-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from bench.lib.fuzz_targets import TARGETS, run_one
from bench.lib.paths import RESULTS


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def fuzz(name: str, examples: int, hang_seconds: int) -> dict:
    counts = {"inputs": 0, "ok": 0, "rejected": 0, "crashes": 0, "hangs": 0}
    first_crash = None
    _, strategy = TARGETS[name]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy())
    def one(data):
        nonlocal first_crash
        counts["inputs"] += 1
        signal.alarm(hang_seconds)
        try:
            counts[run_one(name, data)] += 1
        except Hang:
            counts["hangs"] += 1
        except Exception as exc:  # a crash: counted, kept, and the run goes on
            counts["crashes"] += 1
            first_crash = first_crash or f"{type(exc).__name__}: {exc}"[:300]
        finally:
            signal.alarm(0)

    t0 = time.perf_counter()
    one()
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    if first_crash:
        counts["first_crash"] = first_crash
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-target", type=int, default=12000)
    ap.add_argument("--hang-seconds", type=int, default=5)
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for name in sorted(TARGETS):
        results[name] = fuzz(name, args.per_target, args.hang_seconds)
        print(f"{name:14} {results[name]}", flush=True)
    total = {k: sum(r[k] for r in results.values()) for k in ("inputs", "ok", "rejected", "crashes", "hangs")}
    doc = {"benchmark": "fuzzing the parsers", "command": "python -m bench.micro.fuzz " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "total": total, "targets": results}
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fuzz-{doc['date']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"total {total}\nwrote {path}")
    return 1 if total["crashes"] or total["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
