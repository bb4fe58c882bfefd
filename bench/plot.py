"""Bar chart of a bench/run.py result: end-to-end speedup over native per workload and mode,
with the Proteus paper's V100 warm-cache figure for reference, and the warm kernel speedups.

    python -m bench.plot bench/results/2026-11-23-h100.json     # writes ...-h100.png beside it
    python -m bench.plot RESULT.json -o chart.png

Needs matplotlib (pip install matplotlib); the GPU machine does not, so run it afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODES = [("disabled", "shim, disabled", "#bbbbbb"), ("off", "JIT, specialization off", "#8fb3d9"),
         ("cold", "JIT, cold cache", "#f2a65a"), ("warm", "JIT, warm cache", "#3a7d44")]


def plot(doc: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = [a for a, r in doc["apps"].items() if "speedup" in r]
    paper = doc.get("paper_warm_speedup_v100", {})
    kernels = [(a, k, v["speedup"].get("warm")) for a in apps for k, v in doc["apps"][a].get("kernels", {}).items()
               if v.get("speedup", {}).get("warm")]
    fig, (ax, kx) = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(apps) + 2), 8.5),
                                 gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / (len(MODES) + 1)
    for i, (mode, label, color) in enumerate(MODES):
        xs = [j + (i - len(MODES) / 2) * width for j in range(len(apps))]
        ys = [doc["apps"][a]["speedup"].get(mode, 0.0) for a in apps]
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for b, y in zip(bars, ys):
            if y:
                ax.text(b.get_x() + b.get_width() / 2, y + 0.01, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    xs = [j + (len(MODES) / 2) * width for j in range(len(apps))]
    ax.bar(xs, [paper.get(a, 0.0) for a in apps], width, label="Proteus paper, warm (V100)", color="white",
           edgecolor="black", hatch="//")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(apps)), apps)
    ax.set_ylabel("speedup over native (end to end)")
    env = doc.get("environment", {})
    reps = max((doc['apps'][a].get('reps', 0) for a in apps), default=0)
    ax.set_title(f"proteus-rewrite on {env.get('gpu')}, {doc.get('date')} (median of {reps} runs)")
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.set_ylim(0, max([1.2] + [doc["apps"][a]["speedup"].get(m, 0) * 1.15 for a in apps for m, _, _ in MODES]
                       + [v * 1.15 for v in paper.values()]))
    if kernels:
        kx.bar(range(len(kernels)), [s for _, _, s in kernels], color="#3a7d44")
        kx.set_xticks(range(len(kernels)), [f"{a}:{k}" for a, k, _ in kernels], rotation=45, ha="right", fontsize=7)
        kx.axhline(1.0, color="black", linewidth=0.8)
        kx.set_ylabel("kernel GPU time speedup\n(specialized vs AOT)")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a bench/run.py JSON result")
    ap.add_argument("-o", "--output", help="PNG path (default: the result's name with .png)")
    args = ap.parse_args(argv)
    src = Path(args.result)
    out = plot(json.loads(src.read_text()), Path(args.output) if args.output else src.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
