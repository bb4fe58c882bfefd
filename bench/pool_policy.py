"""Pools the changing_scalars series of several policy_bench runs: each repetition's native /
mode ratio (and control / mode: the shim loaded and disabled, run in the same repetition), over
every series of a group, with the median and a 95% bootstrap interval of the median. One
series of 20-50 repetitions reads anywhere from 0.93 to 1.01 for the same code on the
host-bound configurations (a run's host loop varies by 15% from one run to the next); the
pooled figure is the one to hold against a bar.

    python -m bench.pool_policy --out bench/results/policy-<date>-<gpu>-pooled \\
        --group "before X" a.json b.json --group "from X" c.json ...

Writes OUT.json and OUT.md. A series whose mode lost a repetition (a failed or mismatched run)
leaves that mode out of that series, since its ratios could no longer be paired.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

PAIRS = (("native", "disabled"), ("native", "cold"), ("native", "warm"), ("disabled", "cold"), ("disabled", "warm"))


def interval(ratios: list[float], resamples: int = 2000) -> dict:
    rng = random.Random(0)  # seeded: a rerun agrees
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return {"median": round(statistics.median(ratios), 3),
            "ci95": [round(meds[int(0.025 * resamples)], 3), round(meds[int(0.975 * resamples) - 1], 3)], "n": len(ratios)}


def series_ratios(doc: dict) -> dict[str, dict[str, list[float]]]:
    """config -> "a/b" -> the per-repetition ratios of one results file."""
    out: dict[str, dict[str, list[float]]] = {}
    for config, r in (doc.get("changing_scalars") or {}).items():
        runs = {m: s.get("runs") for m, s in (r.get("modes") or {}).items() if s and s.get("runs")}
        reps = len(runs.get("native") or [])
        for a, b in PAIRS:
            if a in runs and b in runs and len(runs[a]) == len(runs[b]) == reps:
                out.setdefault(config, {})[f"{a}/{b}"] = [x / y for x, y in zip(runs[a], runs[b])]
    return out


def pool(groups: list[tuple[str, list[Path]]]) -> dict:
    result = {}
    for label, files in groups:
        pooled: dict[str, dict[str, list[float]]] = {}
        per_series: dict[str, dict[str, list[dict]]] = {}
        commits = []
        for f in files:
            doc = json.loads(f.read_text())
            commits.append(doc.get("environment", {}).get("git_commit"))
            for config, pairs in series_ratios(doc).items():
                for pair, ratios in pairs.items():
                    pooled.setdefault(config, {}).setdefault(pair, []).extend(ratios)
                    per_series.setdefault(config, {}).setdefault(pair, []).append(
                        {"file": f.name, "median": round(statistics.median(ratios), 3), "n": len(ratios)})
        result[label] = {"files": [f.name for f in files], "commits": commits,
                         "configs": {c: {p: {**interval(r), "series": per_series[c][p]} for p, r in pairs.items()}
                                     for c, pairs in pooled.items()}}
    return result


def markdown(doc: dict) -> str:
    lines = ["# changing_scalars, pooled over policy_bench series", "", f"Command: `{doc['command']}`", "",
             "Each cell: the median over every repetition of the group's series of the ratio within one repetition "
             "(native / mode: above 1 is faster than native; control / mode: against the shim loaded and disabled), "
             "its 95% bootstrap interval, and the number of repetitions. Per series: each file's own median.", ""]
    for label, g in doc["groups"].items():
        lines += [f"## {label}", "", "Series: " + ", ".join(f"[{f}]({f.replace('.json', '.md')})" for f in g["files"]), "",
                  "| configuration | ratio | pooled | per series |", "|---|---|---:|---|"]
        for config, pairs in g["configs"].items():
            for pair, p in pairs.items():
                lines.append(f"| {config} | {pair} | {p['median']}× [{p['ci95'][0]}–{p['ci95'][1]}], n={p['n']} | "
                             + ", ".join(str(s["median"]) for s in p["series"]) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results path without extension (OUT.json, OUT.md)")
    ap.add_argument("--group", nargs="+", action="append", required=True, metavar=("LABEL", "FILE"),
                    help="a label, then the policy_bench results files (JSON) pooled under it")
    args = ap.parse_args(argv)
    groups = []
    for label, *names in args.group:
        files = [Path(n) for n in names]
        bad = [f"{f}: no such file" for f in files if not f.is_file()] or ([f"group {label!r}: no files"] if not files else [])
        for f in files:
            if not bad:
                try:
                    if "changing_scalars" not in json.loads(f.read_text()):
                        bad.append(f"{f}: not a policy_bench results file")
                except (OSError, ValueError) as exc:
                    bad.append(f"{f}: cannot read it as JSON ({exc})")
        if bad:
            print(f"pool_policy: {bad[0]}", file=sys.stderr)
            return 2
        groups.append((label, files))
    doc = {"benchmark": "pool_policy", "command": "python -m bench.pool_policy " + " ".join(
        a if " " not in a else repr(a) for a in (argv if argv is not None else sys.argv[1:])), "groups": pool(groups)}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(f"pool_policy: wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
