"""The Proteus paper's six HeCBench programs under PROTEUS_VALIDATE (docs/user/validate.md):
each program's bitcode build natively, then rewritten and run once with every variant checked
against its original kernel (every launch waiting for its variant, a fresh cache), as
`proteus-rewrite validate` runs it. Output compared with the native run's (timing lines
masked, bench/proteus_compare.py), the checks' outcomes from the report, and the wall time
against the native run's.

    python -m bench.validate_paper --hec DIR --tool proteus-rewrite --out OUT [--programs ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from bench import proteus_compare as pc


def one(prog: str, hec: Path, tool: str, out: Path, timeout: float) -> dict:
    args, _, inputs = pc.PROGRAMS[prog]
    src = hec / prog
    native = pc.run([str(src / "main_all"), *args], src, {}, timeout)
    rec = out / "rewritten" / prog
    p = subprocess.run([tool, str(src / "main_all"), "-o", str(rec)], capture_output=True, text=True)
    res = {"native_rc": native["rc"], "native_wall_s": native["wall_s"], "rewrite_rc": p.returncode}
    if p.returncode != 0:
        res["error"] = p.stderr.strip()[-300:]
        return res
    for f in inputs:
        shutil.copy(src / f, rec / f)
    report = out / f"{prog}.validate.json"
    env = {"PROTEUS_VALIDATE": "1", "PROTEUS_ASYNC_COMPILATION": "0", "PROTEUS_REPORT": str(report),
           "PROTEUS_CACHE_DIR": str(out / "cache" / prog)}
    shutil.rmtree(out / "cache" / prog, ignore_errors=True)
    v = pc.run([str(rec / "main_all"), *args], rec, env, timeout)
    res.update(rc=v["rc"], wall_s=v["wall_s"], same_output=pc.masked(v["stdout"]) == pc.masked(native["stdout"]),
               stderr_tail=v["stderr_tail"][-600:])
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError):
        doc = {}
    outcomes = doc.get("validation") or []
    res["checks"] = {k: sum(o["verdict"] == k for o in outcomes) for k in ("same", "within-ulps", "differs", "varies", "skipped")}
    res["check_ms"] = round(sum(float(o.get("ms") or 0) for o in outcomes), 1)
    res["differing"] = [o.get("reason", "")[:200] for o in outcomes if o["verdict"] == "differs"]
    res["skipped"] = sorted({f"{o['kernel']}: {o.get('reason', '')}"[:200] for o in outcomes if o["verdict"] in ("skipped", "varies")})
    res["specialized_launches"] = sum(k.get("specialized_launches", 0) for k in doc.get("kernels", []))
    res["launches"] = sum(k.get("launches", 0) for k in doc.get("kernels", []))
    return res


def markdown(doc: dict) -> str:
    s = doc["stamp"]
    lines = [f"# The Proteus paper's programs under validation ({s['date']})", "",
             f"Commit {s['commit']}, {s['gpu']}, HeCBench {s['hecbench']}. Each program's bitcode build "
             "(`-Xclang -fembed-bitcode=all`) natively, then rewritten and run once with PROTEUS_VALIDATE=1 and "
             "PROTEUS_ASYNC_COMPILATION=0 in a fresh cache (what `proteus-rewrite validate` runs). One run each.", "",
             "| program | output = native | variants matched | differed | not checked | launches specialized | "
             "check ms | wall s | native wall s | wall / native | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for prog, r in doc["programs"].items():
        if "checks" not in r:
            lines.append(f"| {prog} | - | - | - | - | - | - | - | {r.get('native_wall_s')} | - | {r.get('error', '')} |")
            continue
        c = r["checks"]
        ratio = f"{r['wall_s'] / r['native_wall_s']:.2f}x" if isinstance(r["wall_s"], float) and r["native_wall_s"] else "-"
        notes = "; ".join(r["differing"] + r["skipped"]).replace("|", "\\|")
        lines.append(f"| {prog} | {'yes' if r['same_output'] and r['rc'] == 0 else 'NO'} | {c['same'] + c['within-ulps']} | "
                     f"{c['differs']} | {c['skipped'] + c['varies']} | {r['specialized_launches']}/{r['launches']} | {r['check_ms']} | "
                     f"{r['wall_s']} | {r['native_wall_s']} | {ratio} | {notes} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hec", required=True, help="DIR/<program>/main_all, the bitcode builds")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--programs", nargs="*", default=list(pc.PROGRAMS), choices=list(pc.PROGRAMS))
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--commit", default="")
    ap.add_argument("--hecbench-commit", default="unknown")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = {**pc.stamp(argparse.Namespace(commit=a.commit, reps=1, hecbench_commit=a.hecbench_commit, proteus="/nonexistent"))}
    doc = {"stamp": stamp, "programs": {}}
    for prog in a.programs:
        print(f"validate_paper: {prog}", file=sys.stderr, flush=True)
        doc["programs"][prog] = one(prog, Path(a.hec), a.tool, out, a.timeout)
        (out / "validate-paper.json").write_text(json.dumps(doc, indent=1))
        (out / "validate-paper.md").write_text(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
