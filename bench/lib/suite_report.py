"""The benchmark suite's results files (bench/run.py): the JSON as it stands and its markdown
summary (end to end, per kernel, launch overhead, notes), both rewritten after every workload."""

from __future__ import annotations

import json
from pathlib import Path

# The Proteus paper's V100 end-to-end speedups (Proteus with a warm cache vs AOT, CGO'25 Table 2).
PAPER_WARM = {"adam": 1.36, "rsbench": 1.33, "wsm5": 1.77, "feynman_kac": 1.12, "lulesh": 1.00, "sw4ck": 0.99}
# A variant's compile stages, as PROTEUS_REPORT's timings name them (the per-kernel table's columns).
STAGES = ("plan", "ir", "optimize", "ptx", "cubin", "total")


def _fmt(x, unit="", digits=3):
    if x is None:
        return "—"
    if isinstance(x, float):
        text = f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.{digits}g}"
        return text + unit
    return f"{x}{unit}"


def markdown(doc: dict) -> str:
    e = doc["environment"]
    lines = [f"# Benchmark suite: native vs proteus-rewrite JIT, {doc['date']}", "",
             f"GPU: {e.get('gpu')} (driver {e.get('driver')}, CUDA driver API {e.get('cuda_driver_api')}); "
             f"toolkit: {e.get('cuda_toolkit')}; JIT: LLVM {e.get('llvm')} (llvmlite {e.get('llvmlite')}); "
             f"proteus-rewrite {e.get('proteus_rewrite')} at {str(e.get('git_commit'))[:12]}; apps built by "
             f"{', '.join(e.get('apps_built_by') or ['?'])}.", "",
             f"Command: `{doc['command']}`", "",
             f"Status: {'complete' if not doc.get('partial') else 'PARTIAL (cut short)'}; "
             f"{doc.get('elapsed_s')} s.", "",
             "## End to end (wall time of the whole process; speedup = native median / mode median)", "",
             "| workload | scale | native s (spread) | disabled | off | cold | warm | paper warm (V100) | checksums | reps |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for app, r in doc["apps"].items():
        if "error" in r:
            lines.append(f"| {app} | | FAILED: {r['error'][:120]} | | | | | {PAPER_WARM.get(app, '')} | | |")
            continue
        nat = r["modes"].get("native", {})
        sp = r.get("speedup", {})
        ok = "identical" if not r["checksum_mismatches"] else f"**{len(r['checksum_mismatches'])} MISMATCHES**"
        if r["failures"]:
            ok += f"; {len(r['failures'])} failed runs"
        lines.append(f"| {app} | {r['scale']:g} | {_fmt(nat.get('median'))} ({_fmt(nat.get('spread_pct'), '%', 2)}) | "
                     + " | ".join(f"{sp[m]:.3f}×" if m in sp else "—" for m in ("disabled", "off", "cold", "warm"))
                     + f" | {PAPER_WARM.get(app, '')}× | {ok} | {r['reps']} |")
    lines += ["", "Targets: warm ≥ the paper's figure and ≥ 0.98×; cold ≥ 0.95×; off ≥ 0.98×.", "",
              "## Per kernel (GPU ms per run from CUDA events, median over repetitions)", "",
              "| workload | kernel | launches | native ms | off ms | warm ms | warm kernel speedup | cold compile ms "
              "| plan / ir / optimize / ptx / cubin ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for app, r in doc["apps"].items():
        for kname, k in r.get("kernels", {}).items():
            g = k["gpu_ms"]
            comp = _match(r.get("cold_compile_ms", {}), kname)
            stages = _match(r.get("compile_stages_ms", {}), kname)
            st = " / ".join(_fmt(stages[0].get(s), "", 3) for s in STAGES[:-1]) if isinstance(stages, list) and stages else "—"
            lines.append(f"| {app} | {kname} | {k['launches']} | {_fmt(g.get('native', {}).get('median'))} | "
                         f"{_fmt(g.get('off', {}).get('median'))} | {_fmt(g.get('warm', {}).get('median'))} | "
                         f"{_fmt(k['speedup'].get('warm'), '×')} | {_fmt((comp or {}).get('median'))} | {st} |")
    lo = doc.get("launch_overhead")
    if isinstance(lo, dict) and "error" not in lo and "skipped" not in lo:
        lines += ["", "## Hit-path launch overhead (host ns per launch call; median / min)", "",
                  "| app | native | shim disabled | shim warm | overhead warm (median / min) |", "|---|---:|---:|---:|---:|"]
        for app, r in lo.items():
            lines.append(f"| {app} | {r['native']['median']} / {r['native']['min']} | {r['shim_disabled']['median']} / "
                         f"{r['shim_disabled']['min']} | {r['shim_warm']['median']} / {r['shim_warm']['min']} | "
                         f"{r['overhead_ns_median_shim_warm']} / {r['overhead_ns_min_shim_warm']} |")
    elif lo:
        lines += ["", f"Launch overhead: {lo}"]
    notes = [f"- {app}: {r['reps_reduced']}" for app, r in doc["apps"].items() if r.get("reps_reduced")]
    notes += [f"- {app}: checksum mismatch in {m['mode']} rep {m['rep']}: {m['differ']} (app's check: {m['verify']})"
              for app, r in doc["apps"].items() for m in r.get("checksum_mismatches", [])]
    notes += [f"- {app}: failed run {f}" for app, r in doc["apps"].items() for f in r.get("failures", [])]
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def _match(d: dict, kname: str):
    """Report entries are keyed by demangled name ('adam_update(float*, ...)'); kernel_ms by the short name."""
    if not isinstance(d, dict):
        return None
    for name, v in d.items():
        if name == kname or name.split("(")[0].split("<")[0].split()[-1] == kname:
            return v
    return None


def write(doc: dict, out: Path, base: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    j, m = out / f"{base}.json", out / f"{base}.md"
    for path, text in ((j, json.dumps(doc, indent=1) + "\n"), (m, markdown(doc))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return j, m
