"""Differential test of proteus-rewrite on NVIDIA cuda-samples built by nvcc, on a GPU host.
From the top of the tarball that `build.py --pack` makes (or of the repository):

    python3 -m bench.corpora.cuda_samples.run --tool proteus-rewrite --out DIR
    python3 -m bench.corpora.cuda_samples.run --only vectorAdd,matrixMul --out DIR
    python3 -m bench.corpora.cuda_samples.run --dry-run          # print the commands; needs no GPU

Per sample (samples.json; binaries in work/bin/NAME/NAME beside this file):
  - the native run;
  - `TOOL BIN -o DIR/scratch/NAME/tool`, then the rewritten executable (DIR/.../tool/NAME; the
    original under LD_PRELOAD=.../libproteus.so where the tool wrote none) in three modes:
      sync-cold     PROTEUS_ASYNC_COMPILATION=0, an empty cache
      default-cold  the default policy, an empty cache
      default-warm  the default policy, the cache default-cold left
    each with PROTEUS_REPORT (specialized launches, from the shim);
  - each run's verdict: PASS when it exits 0 and prints the sample's pass line; each tool
    run's output against the native one, after masking the sample's timing lines and
    replacing the executable's path (samples print argv[0]).
With a CUPTI injection library (--kernel-trace LIB or $CUPTI_INJECTION; bench/lib/kernel_trace.c,
built by bench/lib/cupti.py) every run also records the kernels the GPU ran: launches in all,
and those that ran a variant (named `...$proteus$...`).
Writes DIR/results.json and DIR/results.md; exits 1 when any tool run's output or exit code
differs from the native run's, or it lacks the pass line the native run printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from bench.lib import harness
from bench.lib.harness import MODES, log

HERE = Path(__file__).resolve().parent
MASKED = "<masked>"
TAIL = 4000  # characters of stdout kept per run in results.json
REPORT_KEYS = ("launches", "specialized_launches", "failures", "kernels")


# --- comparing ------------------------------------------------------------------------------

def mask(stdout: str, patterns: list[str], exe: str) -> list[str]:
    """stdout's lines with the executable's path replaced (argv[0] differs between the native
    and the rewritten binary) and lines matching a pattern replaced by one marker (so that a
    line missing in one run still shows)."""
    compiled = [re.compile(p) for p in patterns]
    out = []
    for line in stdout.splitlines():
        if exe:
            line = line.replace(exe, "<exe>")
        out.append(MASKED if any(c.search(line) for c in compiled) else line.rstrip())
    return out


def passed(run: dict, pattern: str) -> bool:
    return run["rc"] == 0 and re.search(pattern, run["stdout"], re.MULTILINE) is not None


def run_verdict(run: dict, pattern: str) -> str:
    if run.get("dry_run"):
        return "planned"
    if run["rc"] == "timeout":
        return "TIMEOUT"
    if run["rc"] != 0:
        return f"FAIL (rc {run['rc']})"
    return "PASS" if passed(run, pattern) else "FAIL (no pass line)"


def compare(sample: dict, native: dict, run: dict) -> dict:
    """The tool run against the native one: 'same' output after masking, or 'DIFF' with the
    first differing lines."""
    if run.get("dry_run"):
        return {"output": "planned", "diff": []}
    a = mask(native["stdout"], sample.get("mask", []), native.get("exe", ""))
    b = mask(run["stdout"], sample.get("mask", []), run.get("exe", ""))
    diff = []
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else "<none>"), (b[i] if i < len(b) else "<none>")
        if x != y:
            diff.append(f"line {i + 1}: native {x!r} / tool {y!r}")
    same = not diff and run["rc"] == native["rc"]
    if run["rc"] != native["rc"]:
        diff.insert(0, f"exit code: native {native['rc']} / tool {run['rc']}")
    return {"output": "same" if same else "DIFF", "diff": diff[:10]}


# --- the driver's and the shim's accounts ----------------------------------------------------

def kernels_run(trace: Path) -> dict | None:
    """Kernel launches the GPU executed, by CUPTI: all of them, and those that ran a variant."""
    counts = harness.trace_counts(trace)
    if counts is None:
        return None
    if counts["errors"]:
        return {"error": "; ".join(counts["errors"])}
    return {"launches": counts["launches"], "variants": counts["variants"]}


# --- one sample -----------------------------------------------------------------------------

class Runner:
    def __init__(self, args: argparse.Namespace, tool: list[str]):
        self.work = Path(args.work).resolve()
        self.out = Path(args.out).resolve()
        self.tool = tool
        self.timeout = args.timeout
        self.dry_run = args.dry_run
        self.trace_lib = args.kernel_trace

    def execute(self, exe: Path, sample: dict, env: dict[str, str], trace: Path) -> dict:
        run = harness.run_cmd([str(exe), *sample["args"]], self.work / "bin" / sample["name"],
                              harness.traced(env, self.trace_lib, trace, self.dry_run), self.timeout, self.dry_run)
        run["exe"] = str(exe)
        if self.trace_lib and not self.dry_run:
            run["kernels_run"] = kernels_run(trace)
        run["verdict"] = run_verdict(run, sample["pass"])
        return run

    def sample(self, sample: dict) -> dict:
        name = sample["name"]
        binary = self.work / "bin" / name / name
        scratch = self.out / "scratch" / name
        tool_dir = scratch / "tool"
        if not self.dry_run:
            shutil.rmtree(scratch, ignore_errors=True)  # cold means cold, also on a second run.py run
            for d in (tool_dir, scratch / "cache-sync", scratch / "cache"):
                d.mkdir(parents=True)
        res: dict = {"name": name, "args": sample["args"], "native": None, "rewrite": None, "modes": {}}
        t0 = time.monotonic()
        native = res["native"] = self.execute(binary, sample, {}, scratch / "kernels-native.txt")
        res["rewrite"] = harness.run_cmd([*self.tool, str(binary), "-o", str(tool_dir)], binary.parent, {},
                                         self.timeout, self.dry_run)
        if res["rewrite"]["rc"] == 0:
            exe, env = tool_dir / name, {}
            if not self.dry_run and not exe.exists():  # a tool that only records: the original, preloaded
                exe, env = binary, {"LD_PRELOAD": str(tool_dir / "libproteus.so")}
            for mode in MODES:
                report = scratch / f"report-{mode}.json"
                if not self.dry_run:
                    report.unlink(missing_ok=True)
                run = self.execute(exe, sample, {**env, **harness.mode_env(mode, scratch, report)},
                                   scratch / f"kernels-{mode}.txt")
                run["report"] = None if self.dry_run else harness.read_report(report, REPORT_KEYS)
                run.update(compare(sample, native, run))
                res["modes"][mode] = run
        res["ok"] = self.ok(res)
        res["seconds"] = round(time.monotonic() - t0, 1)
        for run in (res["native"], *res["modes"].values()):  # keep the JSON readable: ends only
            run["stdout_tail"] = run.pop("stdout")[-TAIL:]
        return res

    def ok(self, res: dict) -> bool:
        """False when the tool changed what the sample does: a failed rewrite, another exit code
        or output, or a pass line the native run printed and a tool run did not."""
        if self.dry_run:
            return True
        if res["rewrite"]["rc"] != 0:
            return False
        native_pass = res["native"]["verdict"] == "PASS"
        return all(m["output"] == "same" and (m["verdict"] == "PASS" or not native_pass) for m in res["modes"].values())


# --- the report -----------------------------------------------------------------------------

def launches_cell(run: dict | None) -> str:
    k = (run or {}).get("kernels_run")
    if not k:
        return "-"
    if "error" in k:
        return "CUPTI error"
    return f"{k['launches']}/{k['variants']}"


def specialized_cell(run: dict | None) -> str:
    rep = (run or {}).get("report")
    if not rep:
        return "-"
    failures = sum(rep["failures"].values())
    return f"{rep['specialized_launches']}/{rep['launches']}" + (f" ({failures} failed)" if failures else "")


def mode_cell(res: dict, mode: str) -> str:
    if res["rewrite"]["rc"] != 0:
        return "REWRITE-FAILED"
    run = res["modes"].get(mode)
    if not run:
        return "-"
    return run["verdict"] if run["output"] in ("same", "planned") else f"{run['verdict']}, output DIFF"


def markdown(results: list[dict], header: dict) -> str:
    lines = ["# cuda-samples under proteus-rewrite", "", *[f"- {k}: `{v}`" for k, v in header.items()], "",
             "Verdicts: PASS = exit 0 and the sample's pass line; `output DIFF` = stdout differs from the native "
             "run's after masking timings. Launches (CUPTI): all / ran a variant. Specialized (PROTEUS_REPORT): "
             "specialized launches / launches the shim saw.", "",
             "| sample | args | native | " + " | ".join(MODES) + " | launches native | "
             + " | ".join(f"launches {m}" for m in MODES) + " | " + " | ".join(f"specialized {m}" for m in MODES) + " |",
             "|" + "---|" * (4 + 3 * len(MODES))]
    for r in results:
        modes = [r["modes"].get(m) for m in MODES]
        cells = [r["name"], " ".join(r["args"]) or "-", r["native"]["verdict"], *[mode_cell(r, m) for m in MODES],
                 launches_cell(r["native"]), *[launches_cell(m) for m in modes], *[specialized_cell(m) for m in modes]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    problems = []
    for r in results:
        if r["rewrite"]["rc"] != 0:
            last = (r["rewrite"]["stderr_tail"].strip().splitlines() or [""])[-1]
            problems.append(f"- {r['name']}: rewrite rc {r['rewrite']['rc']}: {last[:300]}")
        for mode, run in r["modes"].items():
            for d in run.get("diff", [])[:3]:
                problems.append(f"- {r['name']} {mode}: {d[:300]}")
    if problems:
        lines += ["", "## Differences", "", *problems]
    return "\n".join(lines) + "\n"


def write_results(out: Path, header: dict, results: list[dict]) -> None:
    harness.write_files(out, {"results.json": json.dumps({**header, "samples": results}, indent=1) + "\n",
                      "results.md": markdown(results, header)})


# --- the CLI --------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(HERE / "work"), help="the builds and manifest.json (default: %(default)s)")
    parser.add_argument("--samples", default=str(HERE / "samples.json"), help="the sample table (default: %(default)s)")
    parser.add_argument("--out", default="cuda-samples-results", help="results folder (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated sample names")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    parser.add_argument("--tool", help="the proteus-rewrite command (default: on PATH or beside this Python)")
    parser.add_argument("--kernel-trace", metavar="LIB", default=os.environ.get("CUPTI_INJECTION") or None,
                        help="CUPTI injection library (bench/lib/kernel_trace.c, built; default: $CUPTI_INJECTION)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.kernel_trace:
        args.kernel_trace = str(Path(args.kernel_trace).resolve())

    samples = json.loads(Path(args.samples).read_text())["samples"]
    only = [n for n in args.only.split(",") if n]
    unknown = set(only) - {s["name"] for s in samples}
    if unknown:
        parser.error(f"--only: not in {args.samples}: {', '.join(sorted(unknown))}")
    samples = [s for s in samples if not only or s["name"] in only]
    tool = harness.tool_command(args.tool)
    runner = Runner(args, tool)
    runnable = [s for s in samples if (runner.work / "bin" / s["name"] / s["name"]).exists()]
    skipped = sorted({s["name"] for s in samples} - {s["name"] for s in runnable})
    if skipped:
        log(f"not built, skipped: {', '.join(skipped)}")
    if not runnable:
        raise SystemExit(f"nothing to run: no builds under {runner.work} (build.py, or unpack the tarball)")

    manifest = harness.load_manifest(runner.work)
    header = {"tool": shlex.join(tool), "tool_version": harness.first_line([*tool, "--version"]) if not args.dry_run else "",
              "gpu": harness.gpu_name(args.nvidia_smi) if not args.dry_run else "",
              "cuda_samples_commit": manifest.get("cuda_samples_commit"), "nvcc": manifest.get("nvcc"),
              "kernel_trace": args.kernel_trace, "skipped": skipped}
    results = []
    for i, sample in enumerate(runnable, 1):
        res = runner.sample(sample)
        results.append(res)
        if not args.dry_run:  # after every sample: a run cut short keeps what it did
            write_results(runner.out, header, results)
        log(f"[{i}/{len(runnable)}] {sample['name']}: native {res['native']['verdict']}; "
            + "; ".join(f"{m} {mode_cell(res, m)}" for m in MODES) + f" ({res['seconds']} s)")
    if args.dry_run:
        return 0
    log(f"wrote {runner.out / 'results.md'} and {runner.out / 'results.json'}")
    bad = [r["name"] for r in results if not r["ok"]]
    if bad:
        log(f"differs from native: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
