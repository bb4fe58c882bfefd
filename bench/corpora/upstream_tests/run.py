"""Run upstream Proteus's CUDA GPU test programs natively and under proteus-rewrite, on a GPU host.
From the top of the tarball `build.py --pack` makes (or of the repository):

    python3 -m bench.corpora.upstream_tests.run --tool $(which proteus-rewrite) -j 4 --out results
    python3 -m bench.corpora.upstream_tests.run --only kernel,daxpy.rdc --kernel-trace-lib ./libkernel_trace.so
    python3 -m bench.corpora.upstream_tests.run --native-only            # the programs alone
    python -m bench.corpora.upstream_tests.run --recheck results --filecheck /usr/lib/llvm-19/bin/FileCheck

Binaries in work/build/RECIPE/NAME (work/ beside this file), what to expect in programs.json. Per program:
  - native runs of the plain build (no bitcode: the reference) and of the recommended build;
  - `proteus-rewrite EXE -o DIR` of the recommended build, then three runs of it with
    LD_PRELOAD=DIR/libproteus.so: "cold" (PROTEUS_ASYNC_COMPILATION=0, an empty
    PROTEUS_CACHE_DIR), "default" (the defaults, an empty cache of its own), "warm"
    (synchronous, the cache the cold run left); PROTEUS_REPORT of each;
  - then upstream's RUN lines, in order, under the tool with each line's environment (lit's
    %t.$$.proteus: a cache folder per program, emptied where upstream's rm -rf precedes it; %S:
    WORK/src/tests/gpu; PROTEUS_ASYNC_COMPILATION=0 unless the line sets it), also when the native
    run failed upstream's checks; outputs saved whole to OUT/upstream-runs/NAME.N.txt;
  - with --kernel-trace-lib (bench/lib/kernel_trace.c built against CUPTI), every run also
    gets CUDA_INJECTION64_PATH and CUPTI_KERNEL_TRACE_FILE: the kernels the driver really ran,
    specialized variants being those whose names contain "$proteus$".
Each cold/default/warm run's stdout must equal the native run's (after programs.json's masks) with the
same exit code, and every run must pass upstream's CHECK lines about the program's own output
(lines Proteus's runtime prints, "[proteus]...", "[ArgSpec]...", are upstream's own trace: not
checked there). A RUN line's output must pass every directive of its prefixes, trace lines
included: pass, CHECK-FAILED, CRASH (nonzero exit: lit's pipefail), TIMEOUT (checks.py).
Writes OUT/upstream-tests.json and OUT/upstream-tests.md after every program; one program's
failure, hang or crash never stops the others. --recheck OUT (no GPU) runs LLVM's FileCheck on
the saved outputs instead: OUT/upstream-filecheck.md and .json.

Standard library only (Python 3.10+): this file travels to GPU hosts that have nothing else.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.corpora.upstream_tests import checks
from bench.corpora.upstream_tests.checks import filecheck  # the FileCheck subset lives in checks.py
from bench.lib import harness
from bench.lib.harness import log

HERE = Path(__file__).resolve().parent

# A line upstream's Proteus runtime prints about itself: "[proteus][JitEngineDevice] ...",
# "[ArgSpec] ...", "[GVarInfo]: ..."; no program output checked upstream starts like that.
TRACE_LINE = re.compile(r"^\[[A-Za-z]")
MASKED = "<masked>"
MODES = ("cold", "default", "warm")
# cold: PROTEUS_ASYNC_COMPILATION=0 on an empty cache (every launch runs JIT code); default: the
# defaults on an empty cache of its own (a launch may run as built while its variant compiles);
# warm: synchronous again, on the cache cold left.
TAIL = 4000  # characters of stdout/stderr kept per run


# --- upstream's CHECK lines about the program's output ---------------------------------------

def output_checks(program: dict) -> list[dict]:
    """The directives about the program's own output: those of every prefix upstream's RUN lines
    use (a first run may check only CHECK-FIRST, a later one CHECK), less Proteus's trace lines."""
    prefixes = {p for r in program.get("runs", []) for p in r["check_prefixes"]}
    return [c for c in program.get("checks", []) if c["prefix"] in prefixes and not TRACE_LINE.match(c["pattern"])]


# --- comparing outputs -----------------------------------------------------------------------

def masked(text: str, masks: list[str]) -> list[str]:
    """Output lines with each mask's matches replaced (device addresses and the like), trailing
    blanks dropped."""
    rxs = [re.compile(m) for m in masks]
    out = []
    for line in text.splitlines():
        for rx in rxs:
            line = rx.sub(MASKED, line)
        out.append(line.rstrip())
    return out


def comparable(text: str, program: dict) -> list[str]:
    """A run's output as compared with another run's: masked, and sorted where upstream's own
    checks are order-free (CHECK-DAG: printf from several blocks, whose order the GPU picks)."""
    lines = masked(text, program.get("mask", []))
    if any(c["directive"] == "DAG" for c in output_checks(program)):
        return sorted(lines)
    return lines


def first_difference(expected: list[str], got: list[str]) -> str | None:
    for i in range(max(len(expected), len(got))):
        a = expected[i] if i < len(expected) else None
        b = got[i] if i < len(got) else None
        if a != b:
            return f"line {i + 1}: native {a!r}, tool {b!r}"
    return None


def kernel_counts(path: Path) -> dict | None:
    """From the CUPTI injection library's file: kernels run, specialized variants and originals."""
    counts = harness.trace_counts(path)
    if counts is None:
        return None
    out = {"variants": counts["variants"], "originals": counts["originals"]}
    if counts["errors"]:
        out["error"] = counts["errors"][0]
    return out


def report_summary(path: Path) -> dict | None:
    """From a PROTEUS_REPORT (proteus_rewrite/runtime/report.py): launches, how many ran a
    specialized variant, fallbacks, and failures by reason."""
    return harness.read_report(path, ("launches", "specialized_launches", "fallback_launches", "failures"))


# --- running ---------------------------------------------------------------------------------

@dataclass
class Context:
    work: Path
    out: Path
    tool: list[str]
    timeout: float
    trace_lib: str | None
    native_only: bool
    sources: Path | None = None  # upstream's extracted tree (lit's %S lies under it)


def run_cmd(cmd: list[str], cwd: Path, env_extra: dict[str, str], timeout: float) -> dict:
    """One command's record, all of its stderr kept: RUN lines and CHECK lines may read it."""
    return {"cmd": shlex.join(cmd), "env": env_extra, **harness.execute(cmd, cwd, env_extra, timeout)}


def run_app(exe: Path, program: dict, scratch: Path, label: str, env: dict[str, str], ctx: Context) -> dict:
    trace = scratch / f"kernels-{label}.txt"
    env = harness.traced(env, ctx.trace_lib, trace)
    result = run_cmd([str(exe), *program.get("args", [])], scratch, env, ctx.timeout)
    result["check_failures"] = filecheck(result["stdout"], output_checks(program))
    if ctx.trace_lib:
        result["kernels"] = kernel_counts(trace)
    return result


def mode_verdict(native: dict, run: dict, program: dict) -> tuple[str, str]:
    """(verdict, detail) of one tool run against the native run of the same binary."""
    if run["rc"] == "timeout":
        return "TIMEOUT", f"over {run['seconds']} s"
    if run["rc"] != native["rc"]:
        return "CRASH", f"{_exit(run)} (natively {_exit(native)})"
    diff = first_difference(comparable(native["stdout"], program), comparable(run["stdout"], program))
    if diff:
        return "DIFF", diff
    if run["check_failures"]:
        return "CHECK-FAILED", run["check_failures"][0]
    return "ok", ""


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][:200]


def _exit(run: dict) -> str:
    """How a run ended, for a person: 'exit 3', 'SIGABRT', with its last word (stderr, else stdout)."""
    rc = run["rc"]
    how = f"exit {rc}"
    if isinstance(rc, int) and rc < 0:
        try:
            how = signal.Signals(-rc).name
        except ValueError:
            pass
    last = _last_line(run["stderr"]) or _last_line(run["stdout"])
    return f"{how}: {last}" if last else how


def run_program(program: dict, ctx: Context) -> dict:
    name = program["name"]
    scratch = ctx.out / "scratch" / name
    shutil.rmtree(scratch, ignore_errors=True)  # cold means cold, also on a second run.py run
    scratch.mkdir(parents=True)
    res: dict = {"name": name, "source": program["source"], "note": program.get("note", ""), "runs": {},
                 "expected_output_source": program.get("expected_output_source", program["source"])}
    t0 = time.monotonic()
    builds = {r: ctx.work / "build" / r / name for r in ("plain", "recommended")}
    for recipe, exe in builds.items():
        if exe.exists():
            res["runs"][f"native-{recipe}"] = run_app(exe, program, scratch, f"native-{recipe}", {}, ctx)
    res.update(judge_native(res["runs"], program))
    # upstream's RUN lines judge the tool's output by CHECK lines alone: a native run failing the
    # checks about program output does not make them pointless, a missing or hanging one does
    lines_too = res["verdict"] in (None, "native-failed", "native-check-failed")
    if lines_too and not ctx.native_only:
        tool_dir = scratch / "tool"
        rewrite = run_cmd([*ctx.tool, str(builds["recommended"]), "-o", str(tool_dir)], scratch, {}, ctx.timeout)
        res["runs"]["rewrite"] = rewrite
        if rewrite["rc"] != 0:
            res["upstream_runs"] = checks.not_run(program, f"rewrite failed: {_exit(rewrite)}")
            if res["verdict"] is None:
                res["verdict"] = "REWRITE-FAILED"
                res["detail"] = _exit(rewrite)
        else:
            if res["verdict"] is None:  # cold and warm compare with a sound native run only
                native = res["runs"]["native-recommended"]
                for mode in MODES:
                    report = scratch / f"report-{mode}.json"
                    env = {"LD_PRELOAD": str(tool_dir / "libproteus.so"), "PROTEUS_ASYNC_COMPILATION": "0",
                           "PROTEUS_CACHE_DIR": str(scratch / ("cache-default" if mode == "default" else "cache")),
                           "PROTEUS_REPORT": str(report)}
                    if mode == "default":
                        del env["PROTEUS_ASYNC_COMPILATION"]
                    run = res["runs"][mode] = run_app(builds["recommended"], program, scratch, mode, env, ctx)
                    run["report"] = report_summary(report)
                    run["verdict"], run["detail"] = mode_verdict(native, run, program)
                bad = [m for m in MODES if res["runs"][m]["verdict"] != "ok"]
                res["verdict"] = f"{bad[0]}: {res['runs'][bad[0]]['verdict']}" if bad else "ok"
                res["detail"] = res["runs"][bad[0]]["detail"] if bad else ""
            res["upstream_runs"] = run_lines(program, ctx, scratch, tool_dir, builds["recommended"])
    elif res["verdict"] is None:
        res["verdict"], res["detail"] = "native ok", ""
    elif not ctx.native_only:
        res["upstream_runs"] = checks.not_run(program, res["verdict"])
    res["seconds"] = round(time.monotonic() - t0, 1)
    for run in res["runs"].values():  # the JSON keeps the ends of the outputs
        run["stdout_tail"] = run.pop("stdout")[-TAIL:]
        run["stderr_tail"] = run.pop("stderr")[-TAIL:]
    return res


def run_lines(program: dict, ctx: Context, scratch: Path, tool_dir: Path, exe: Path) -> list[dict]:
    """Upstream's RUN lines, in order, under the tool with each line's environment (checks.py
    makes lit's substitutions); every output saved whole to OUT/upstream-runs/NAME.N.txt."""
    saved = ctx.out / "upstream-runs"
    saved.mkdir(parents=True, exist_ok=True)
    for old in saved.iterdir():  # a previous run.py run's outputs must not pass for this one's
        if re.fullmatch(rf"{re.escape(program['name'])}\.\d+\.(txt|stderr)", old.name):
            old.unlink()
    cache_dir = scratch / "upstream.proteus"  # lit's %t.$$.proteus
    shutil.rmtree(scratch / "default.proteus", ignore_errors=True)  # where lines without one cache (checks.line_env)
    s_dir = checks.source_dir(program, ctx.sources or ctx.work / "src")
    out = []
    for n, line in enumerate(program.get("runs", []), 1):
        rec = checks.line_record(n, line)
        try:
            env = checks.line_env(line, cache_dir, s_dir)
        except ValueError as exc:
            out.append({**rec, "detail": str(exc)})
            continue
        missing = checks.missing_files(env, s_dir)
        if missing:
            out.append({**rec, "detail": f"missing {', '.join(missing)} (build.py --pack carries it)"})
            continue
        checks.prepare_cache(line, cache_dir)
        trace = scratch / f"kernels-upstream-{n}.txt"
        env["LD_PRELOAD"] = str(tool_dir / "libproteus.so")
        env = harness.traced(env, ctx.trace_lib, trace)
        run = run_cmd([str(exe), *program.get("args", [])], scratch, env, ctx.timeout)
        text = checks.line_text(run["stdout"], run["stderr"], line)
        out_file = saved / f"{program['name']}.{n}.txt"
        out_file.write_text(text)
        if not line.get("stderr_too") and run["stderr"]:
            (saved / f"{program['name']}.{n}.stderr").write_text(run["stderr"])  # not FileCheck's input
        rec.update(env=env, rc=run["rc"], seconds=run["seconds"], output_file=str(out_file.relative_to(ctx.out)),
                   stderr_tail=run["stderr"][-TAIL:],
                   **checks.judge_line(program, line, text, run["rc"], run["seconds"], _exit(run)))
        if ctx.trace_lib:
            rec["kernels"] = kernel_counts(trace)
        out.append(rec)
    return out


def judge_native(runs: dict, program: dict) -> dict:
    """The native runs' verdict: None when they are fit to compare the tool's runs with."""
    native = runs.get("native-recommended")
    if native is None:
        return {"verdict": "not-built", "detail": "no recommended build"}
    plain = runs.get("native-plain")
    if plain is not None:
        same = plain["rc"] == native["rc"] and not first_difference(
            comparable(plain["stdout"], program), comparable(native["stdout"], program))
        native["same_as_plain"] = same
    if native["rc"] == "timeout":
        return {"verdict": "native-timeout", "detail": f"over {native['seconds']} s"}
    if native["rc"] != 0:
        return {"verdict": "native-failed", "detail": _exit(native)}
    if native["check_failures"]:
        return {"verdict": "native-check-failed", "detail": native["check_failures"][0]}
    return {"verdict": None, "detail": ""}


# --- the report ------------------------------------------------------------------------------

def _kernels_cell(run: dict | None) -> str:
    k = (run or {}).get("kernels")
    if not k:
        return "-"
    return f"{k['variants']}/{k['originals']}" + (" (error)" if "error" in k else "")


def _native_cell(runs: dict) -> str:
    native = runs.get("native-recommended")
    if native is None:
        return "-"
    ok = native["rc"] == 0 and not native["check_failures"]
    plain = native.get("same_as_plain")
    return ("ok" if ok else "FAIL") + ("" if plain is None else ", = plain" if plain else ", != plain")


def markdown(results: list[dict], header: dict) -> str:
    lines = ["# Upstream Proteus GPU tests under proteus-rewrite", "",
             *[f"- {k}: `{v}`" for k, v in header.items()], "",
             "native: the recommended build alone exits 0 and passes upstream's CHECK lines about program output "
             "(`= plain`: same output as the build without bitcode). cold / default / warm: under the tool, "
             "PROTEUS_ASYNC_COMPILATION=0 on an empty cache / the defaults on an empty cache / synchronous on the "
             "cache cold left; ok = same exit code, same stdout as native, CHECK lines pass. kernels: "
             "variants/originals the driver ran (CUPTI), `-` = no trace.", ""]
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    lines += ["Verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())), ""]
    lines += ["| program | native | cold | default | warm | kernels cold | kernels warm | specialized launches (cold) | detail |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        runs = r["runs"]
        rep = (runs.get("cold") or {}).get("report") or {}
        spec = f"{rep['specialized_launches']}/{rep['launches']}" if rep else "-"
        detail = (r.get("detail") or r.get("note") or "").replace("|", "\\|")[:160]
        cells = [r["name"], _native_cell(runs), (runs.get("cold") or {}).get("verdict", "-"),
                 (runs.get("default") or {}).get("verdict", "-"), (runs.get("warm") or {}).get("verdict", "-"),
                 _kernels_cell(runs.get("cold")), _kernels_cell(runs.get("warm")), spec, detail]
        lines.append("| " + " | ".join(cells) + " |")
    lines += checks.markdown_runs(results)
    return "\n".join(lines) + "\n"


def write_results(out: Path, header: dict, results: list[dict]) -> None:
    harness.write_files(out, {"upstream-tests.json": json.dumps({**header, "programs": results}, indent=1) + "\n",
                              "upstream-tests.md": markdown(results, header)})


# --- the CLI ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(HERE / "work"), help="the built tree (default: %(default)s)")
    parser.add_argument("--programs", default=str(HERE / "programs.json"), help="default: %(default)s")
    parser.add_argument("--tool", help="the proteus-rewrite command (default: on PATH or beside this Python)")
    parser.add_argument("--out", default="upstream-tests-results", help="results folder (default: %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=4, help="programs in parallel (default 4)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per run (default 60)")
    parser.add_argument("--kernel-trace-lib", help="CUPTI injection library (bench/lib/kernel_trace.c)")
    parser.add_argument("--only", default="", help="comma-separated program names")
    parser.add_argument("--native-only", action="store_true", help="native runs only, no tool")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--sources", help="upstream's extracted tree, for %%S and --recheck (default: WORK/src)")
    parser.add_argument("--recheck", metavar="OUT", help="no runs: LLVM FileCheck on the RUN-line outputs saved in OUT")
    parser.add_argument("--filecheck", help="FileCheck for --recheck (e.g. /usr/lib/llvm-19/bin/FileCheck)")
    args = parser.parse_args(argv)
    sources = Path(args.sources or Path(args.work) / "src").resolve()
    if args.recheck:
        filecheck_bin = args.filecheck or shutil.which("FileCheck-19") or shutil.which("FileCheck")
        if not filecheck_bin:
            parser.error("--recheck needs --filecheck PATH (LLVM's FileCheck)")
        if not (Path(args.recheck) / "upstream-tests.json").is_file():
            parser.error(f"--recheck {args.recheck}: no upstream-tests.json there")
        return checks.recheck(Path(args.recheck).resolve(), filecheck_bin, sources,
                              json.loads(Path(args.programs).read_text()))

    doc = json.loads(Path(args.programs).read_text())
    programs = [p for p in doc["programs"] if not p.get("excluded")]
    only = [n for n in args.only.split(",") if n]
    if only:
        unknown = sorted(set(only) - {p["name"] for p in programs})
        if unknown:
            parser.error(f"unknown or excluded program(s): {', '.join(unknown)}")
        programs = [p for p in programs if p["name"] in only]
    trace_lib = None
    if args.kernel_trace_lib:
        trace_lib = str(Path(args.kernel_trace_lib).resolve())
        if not Path(trace_lib).is_file():
            parser.error(f"--kernel-trace-lib {trace_lib}: no such file")
    tool = harness.tool_command(args.tool)
    work = Path(args.work).resolve()
    manifest = harness.load_manifest(work)
    ctx = Context(work, Path(args.out).resolve(), tool, args.timeout, trace_lib, args.native_only, sources)
    header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": os.uname().nodename, "command": shlex.join([sys.executable, *sys.argv]),
              "commit": os.environ.get("PROTEUS_COMMIT")
              or harness.first_line(["git", "-C", str(HERE), "rev-parse", "HEAD"], 60) or "unknown",
              "tool": shlex.join(tool), "tool_version": "" if args.native_only else harness.first_line([*tool, "--version"], 60),
              "gpu": harness.gpu_name(args.nvidia_smi, timeout=60),
              "upstream_commit": doc.get("upstream", {}).get("commit"), "clang": manifest.get("clang"),
              "timeout_s": args.timeout, "kernel_trace": bool(trace_lib),
              "excluded": len(doc["programs"]) - len([p for p in doc["programs"] if not p.get("excluded")])}
    results: dict[str, dict] = {}

    def one(program: dict) -> None:
        try:
            res = run_program(program, ctx)
        except Exception:  # a bug meeting one program's oddity must not cost the others
            res = {"name": program["name"], "source": program.get("source"), "runs": {},
                   "verdict": "HARNESS-ERROR", "detail": traceback.format_exc()[-2000:]}
        with harness.LOCK:
            results[program["name"]] = res
            write_results(ctx.out, header, [results[p["name"]] for p in programs if p["name"] in results])
            done = len(results)
        log(f"[{done}/{len(programs)}] {program['name']}: {res['verdict']}  {res.get('detail', '')[:120]}")

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, programs))
    write_results(ctx.out, header, [results[p["name"]] for p in programs if p["name"] in results])
    log(f"wrote {ctx.out / 'upstream-tests.md'} and {ctx.out / 'upstream-tests.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
