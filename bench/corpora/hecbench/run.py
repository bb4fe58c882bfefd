"""Differential testing of proteus-rewrite on the HeCBench corpus, on a GPU host. From the top
of the tarball that `build.py --pack` makes (or of the repository):

    python3 -m bench.corpora.hecbench.run --out results            # every program that built
    python3 -m bench.corpora.hecbench.run --only jacobi,wsm5 -j 1  # two programs, one at a time
    python3 -m bench.corpora.hecbench.run --dry-run                # print the commands; needs no GPU

Binaries in work/build/RECIPE/NAME/main (work/ beside this file), next to their inputs. Per program:
  - native runs: the plain build, the recommended build (twice: lines where two native runs
    disagree are the program's own nondeterminism, not the tool's), the fembed-bitcode build,
    the nvcc build (twice too: nvcc's code and its nondeterminism are its own);
  - `proteus-rewrite main -o DIR` of the recommended build (and of the exact-fp, fembed-bitcode,
    shared-lib and nvcc builds where they exist), then runs under the tool,
    LD_PRELOAD=DIR/libproteus.so, in three modes:
      sync-cold     PROTEUS_ASYNC_COMPILATION=0, an empty cache: every launch runs JIT code
      default-cold  the default policy, an empty cache
      default-warm  the default policy, the cache default-cold left
    each compared with the native run of the same binary after masking (programs.json);
  - PROTEUS_REPORT of every tool run: the share of launches specialized, and failures;
  - with --speed-reps N (and --kernel-trace LIB): where default-warm matched native, N native and
    N default-warm runs, alternating, each with CUPTI's per-kernel GPU times
    (CUPTI_KERNEL_TRACE_TIMES=1): the total kernel time per run, medians, native/warm speed-up.
Writes OUT/hecbench-corpus.json (everything) and OUT/hecbench-corpus.md (a table).

Testing without a GPU: --exe PATH runs PATH in place of every program's binary (same
arguments, same folder), --tool PATH a stand-in for proteus-rewrite, --nvidia-smi PATH one
for nvidia-smi.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.corpora.hecbench import corpus
from bench.lib import harness
from bench.lib.harness import MODES, VARIANT_MARK, log

HERE = Path(__file__).resolve().parent

# --validate adds a run under PROTEUS_VALIDATE (every variant checked against its original on
# its first launch; runtime/validate.py), in a fresh cache of its own
VALIDATE = "validate"
EXTRA_MODES: tuple[str, ...] = ()
NOCHECK = "nocheck-cold"  # --check-cost: default-cold again with PROTEUS_VALIDATE=0, in a cache of its own
TOOL_RECIPES = ("recommended", "exact-fp", "fembed-bitcode", "shared-lib", "nvcc")
# recipes run natively twice, and the second run's name: the lines where the two disagree are
# ignored when their tool runs are compared
AGAIN = {"recommended": "recommended-again", "nvcc": "nvcc-again"}
DEFAULT_RTOL = 1e-6  # numbers this close count as "close", not "differs"
TAIL = 4000  # characters of stdout kept per run


@dataclass
class Context:
    work: Path
    out: Path
    tool: list[str]
    exe: str | None
    timeout: float
    dry_run: bool
    native_only: bool
    recipes: tuple[str, ...]
    doc: dict
    manifest: dict
    kernel_trace: str | None = None  # a CUPTI injection library (bench/lib/kernel_trace.c) for the tool's runs
    speed_reps: int = 0  # --speed-reps: traced native / default-warm pairs timed by CUPTI after the checks
    cost_reps: int = 0  # --check-cost-reps: untraced cold pairs, with and without the default check
    cost_env: dict[str, str] = field(default_factory=dict)  # --check-cost-with: a third side, checked under these


# --- running one command ------------------------------------------------------------------

def run_cmd(cmd: list[str], cwd: Path, env_extra: dict[str, str], ctx: Context) -> dict:
    return harness.run_cmd(cmd, cwd, env_extra, ctx.timeout, ctx.dry_run)


def app_command(program: dict, recipe: str, ctx: Context) -> tuple[list[str], Path]:
    folder = ctx.work / "build" / recipe / program["name"]
    exe = ctx.exe or "./main"  # relative: the program runs in its folder, among its inputs
    return [exe, *program["args"]], folder


# --- one program ----------------------------------------------------------------------------

def built(ctx: Context, name: str, recipe: str) -> bool:
    if recipe not in ctx.recipes:
        return False
    entry = ctx.manifest.get("programs", {}).get(name, {}).get(recipe, {})
    return entry.get("status") == "ok" and (ctx.work / "build" / recipe / name / "main").exists()


def native_run(program: dict, recipe: str, ctx: Context) -> dict:
    cmd, cwd = app_command(program, recipe, ctx)
    return run_cmd(cmd, cwd, {}, ctx)


def tool_runs(program: dict, recipe: str, scratch: Path, ctx: Context) -> dict:
    """Rewrite one build and run it in the three modes; returns {"rewrite": ..., MODE: ...}."""
    folder = ctx.work / "build" / recipe / program["name"]
    tool_dir = scratch / recipe / "tool"
    for d in (tool_dir, scratch / recipe / "cache-sync", scratch / recipe / "cache", scratch / recipe / "cache-validate",
              scratch / recipe / "cache-nocheck"):
        if not ctx.dry_run:
            shutil.rmtree(d, ignore_errors=True)  # cold means cold, also on a second run.py run
            d.mkdir(parents=True)
    result = {"rewrite": run_cmd([*ctx.tool, str(folder / "main"), "-o", str(tool_dir)], folder, {}, ctx)}
    if result["rewrite"]["rc"] != 0:
        return result
    cmd, cwd = app_command(program, recipe, ctx)
    for mode in MODES + EXTRA_MODES:
        report = scratch / recipe / f"report-{mode}.json"
        if not ctx.dry_run:
            report.unlink(missing_ok=True)
        trace = scratch / recipe / f"kernels-{mode}.txt"
        # the driver's account of what ran, beside the shim's report
        env = harness.traced(tool_env(scratch, recipe, mode, report), ctx.kernel_trace, trace, ctx.dry_run)
        run = run_cmd(cmd, cwd, env, ctx)
        if ctx.kernel_trace:
            run["kernels_run"] = kernels_run(trace)
        run["report"] = harness.read_report(report)
        if mode != "default-warm":  # what the check found (PROTEUS_VALIDATE: the default, or every variant)
            run["validation"] = validation_counts(report)
        result[mode] = run
    return result


def tool_env(scratch: Path, recipe: str, mode: str, report: Path) -> dict[str, str]:
    """The environment additions of a run under the tool in `mode` (rewritten into scratch/RECIPE/tool)."""
    env = {"LD_PRELOAD": str(scratch / recipe / "tool" / "libproteus.so")}
    if mode == NOCHECK:  # the default cold run without its check, for the check's cost
        return {**env, "PROTEUS_CACHE_DIR": str(scratch / recipe / "cache-nocheck"), "PROTEUS_REPORT": str(report),
                "PROTEUS_VALIDATE": "0"}
    if mode != VALIDATE:
        return {**env, **harness.mode_env(mode, scratch / recipe, report)}
    return {**env, "PROTEUS_CACHE_DIR": str(scratch / recipe / "cache-validate"), "PROTEUS_REPORT": str(report),
            "PROTEUS_ASYNC_COMPILATION": "0", "PROTEUS_VALIDATE": "1"}


def kernels_run(trace: Path) -> dict | None:
    """Kernel launches the GPU executed, by CUPTI: variants (named `...$proteus$...`) and originals."""
    counts = harness.trace_counts(trace)
    return None if counts is None else {"variants": counts["variants"], "originals": counts["originals"]}


def validation_counts(path: Path) -> dict | None:
    """A validated run's outcomes: variants that matched their original, differed, were not checked."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    outcomes = doc.get("validation") or []
    counts = {"same": 0, "within-ulps": 0, "differs": 0, "varies": 0, "skipped": 0}
    for o in outcomes:
        counts[o.get("verdict", "skipped")] = counts.get(o.get("verdict", "skipped"), 0) + 1
    counts["differing_kernels"] = sorted({o["kernel"] for o in outcomes if o.get("verdict") == "differs"})
    counts["skip_reasons"] = sorted({o.get("reason", "") for o in outcomes if o.get("verdict") == "skipped"})
    counts["varying_kernels"] = sorted({o["kernel"] for o in outcomes if o.get("verdict") == "varies"})
    counts["check_ms"] = round(sum(float(o.get("ms") or 0) for o in outcomes), 1)
    # the shim's own account: the checks' whole time as the budget counts it, and by phase
    counts["shim_checks"] = (doc.get("shim_wait_ms") or {}).get("checks")
    return counts


# --- GPU kernel time (--speed-reps) ---------------------------------------------------------

SPEED_MODE = "default-warm"  # the run timed against native: the policy users get, its cache filled
MATCHED = ("ok", "close")  # outputs that count as the native one's


def kernel_times(trace: Path) -> list[tuple[str, int]]:
    """(kernel name, GPU nanoseconds) of every kernel a run executed, from a trace kernel_trace.c
    wrote with CUPTI_KERNEL_TRACE_TIMES=1 (bench/lib/cupti.py kernel_times, kept here: this
    file travels alone). ValueError when the trace is missing, reports an error, or is not timed."""
    try:
        text = trace.read_text(errors="replace")
    except OSError as exc:
        raise ValueError(f"no trace: {exc.strerror or exc}") from None
    out = []
    for line in text.splitlines():
        name, sep, ns = line.rpartition("\t")
        if line.startswith("#") or not sep or not ns.isdigit():
            raise ValueError(f"not a timed trace: {line[:200]!r}")
        out.append((name, int(ns)))
    if not out:
        raise ValueError("empty trace: no kernel recorded")
    return out


def first_launches_ns(times: list[tuple[str, int]]) -> int:
    """The GPU time of each kernel's first launch, a variant's counted as its kernel's (the name
    before VARIANT_MARK): what a run pays once (a cold instruction cache, a module's first use),
    apart from the launches that repeat."""
    seen: set[str] = set()
    total = 0
    for name, ns in times:
        base = name.split(VARIANT_MARK, 1)[0]
        if base not in seen:
            seen.add(base)
            total += ns
    return total


def speed_runs(program: dict, recipe: str, scratch: Path, native: dict, again: dict | None, ctx: Context) -> list[dict]:
    """--speed-reps N: N native runs and N default-warm runs of one build, alternating, each with
    CUPTI's per-kernel GPU times; every run's output is compared with the native reference run
    (a run that differs or fails is kept in the list with its reason, and left out of the times)."""
    cmd, cwd = app_command(program, recipe, ctx)
    records = []
    for rep in range(ctx.speed_reps):
        for side in ("native", "warm"):
            trace = scratch / recipe / f"speed-{side}-{rep}.txt"
            report = scratch / recipe / f"report-speed-{rep}.json"
            env = {} if side == "native" else tool_env(scratch, recipe, SPEED_MODE, report)
            env = {**harness.traced(env, str(ctx.kernel_trace), trace, ctx.dry_run), "CUPTI_KERNEL_TRACE_TIMES": "1"}
            rec, run, cmp = judged_run(program, cmd, cwd, env, native, again, ctx, rep, side)
            records.append(rec)
            if cmp is None:
                continue
            if cmp["verdict"] not in MATCHED:
                rec.update(excluded=f"output {cmp['verdict']}", diff=cmp["diff"], stderr_tail=run["stderr_tail"][-500:])
            else:
                try:
                    times = kernel_times(trace)
                except ValueError as exc:
                    rec["excluded"] = str(exc)
                else:
                    rec.update(kernel_ms=round(sum(ns for _, ns in times) / 1e6, 4), launches=len(times),
                               variant_launches=sum(VARIANT_MARK in name for name, _ in times),
                               first_ms=round(first_launches_ns(times) / 1e6, 4))
    return records


def judged_run(program: dict, cmd: list[str], cwd: Path, env: dict[str, str], native: dict, again: dict | None,
               ctx: Context, rep: int, side: str) -> tuple[dict, dict, dict | None]:
    """One timed run of a series (--speed-reps, --check-cost-reps): its record, the run, and its
    output compared with the native reference (None in a dry run, whose record says so)."""
    run = run_cmd(cmd, cwd, env, ctx)
    rec = {"rep": rep, "side": side, "rc": run["rc"], "seconds": run["seconds"]}
    if ctx.dry_run:
        rec["excluded"] = "dry run"
        return rec, run, None
    cmp = compare_runs(program, native, again, run, ctx)
    rec["verdict"] = cmp["verdict"]
    return rec, run, cmp


def speed_summary(records: list[dict], reps: int) -> dict:
    """The kept runs' total kernel times per side: lists, medians, spread, native / warm medians."""
    out: dict = {"reps": reps, "runs": records}
    for side in ("native", "warm"):
        kept = [r for r in records if r["side"] == side and "excluded" not in r]
        ms = [r["kernel_ms"] for r in kept]
        out[f"{side}_ms"] = ms
        out[f"{side}_median_ms"] = round(statistics.median(ms), 4) if ms else None
        out[f"{side}_min_ms"], out[f"{side}_max_ms"] = (min(ms), max(ms)) if ms else (None, None)
        out[f"{side}_launches"] = [r["launches"] for r in kept]
        out[f"{side}_variant_launches"] = [r["variant_launches"] for r in kept]
        out[f"{side}_excluded"] = sum(r["side"] == side and "excluded" in r for r in records)
    n, w = out["native_median_ms"], out["warm_median_ms"]
    out["speedup"] = round(n / w, 4) if n and w else None  # > 1: faster under the tool
    # the same without each kernel's first launch: a program that launches a kernel a few
    # times can owe its ratio to what the first launch pays
    steady = {side: [r["kernel_ms"] - r.get("first_ms", 0.0) for r in records if r["side"] == side and "excluded" not in r]
              for side in ("native", "warm")}
    sn, sw = (statistics.median(steady[side]) if steady[side] else 0.0 for side in ("native", "warm"))
    out["steady_speedup"] = round(sn / sw, 4) if sn > 0 and sw > 0 else None
    return out


def measure_speed(program: dict, recipe: str, scratch: Path, res: dict, again: dict | None, ctx: Context) -> dict:
    """res["speed"][recipe]: timed runs when default-warm's output matched native, else why not."""
    warm = res["verdicts"].get(recipe, {}).get(SPEED_MODE)
    if warm is None:
        return {"skipped": f"no {SPEED_MODE} run (--modes)"}
    if warm["verdict"] not in MATCHED:
        return {"skipped": f"{SPEED_MODE} {warm['verdict']}"}
    return speed_summary(speed_runs(program, recipe, scratch, res["native"][recipe], again, ctx), ctx.speed_reps)


# --- the default check's cost (--check-cost-reps) ----------------------------------------------

COST_SIDES = ("check", "nocheck")
ALSO = "check-with"  # --check-cost-with K=V: the default check again under other settings


def cost_sides(ctx: Context) -> tuple[str, ...]:
    return COST_SIDES + ((ALSO,) if ctx.cost_env else ())


def cost_runs(program: dict, recipe: str, scratch: Path, native: dict, again: dict | None, ctx: Context) -> list[dict]:
    """--check-cost-reps N: N cold runs with the default check, N without it (PROTEUS_VALIDATE=0)
    and N checked under --check-cost-with's settings if any, each side first in turn, each from
    an empty cache of its own and untraced (CUPTI's own cost stays out of the wall time); every
    run's output is compared with the native reference, and its report gives the checks it made
    and their time."""
    cmd, cwd = app_command(program, recipe, ctx)
    records, sides = [], cost_sides(ctx)
    for rep in range(ctx.cost_reps):
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
            cache, report = scratch / recipe / f"cache-cost-{side}", scratch / recipe / f"report-cost-{side}-{rep}.json"
            if not ctx.dry_run:
                shutil.rmtree(cache, ignore_errors=True)
                report.unlink(missing_ok=True)
            env = {"LD_PRELOAD": str(scratch / recipe / "tool" / "libproteus.so"), "PROTEUS_CACHE_DIR": str(cache),
                   "PROTEUS_REPORT": str(report), **({"PROTEUS_VALIDATE": "0"} if side == "nocheck" else {}),
                   **(ctx.cost_env if side == ALSO else {})}
            rec, run, cmp = judged_run(program, cmd, cwd, env, native, again, ctx, rep, side)
            records.append(rec)
            if cmp is None:
                continue
            counts = validation_counts(report) or {}
            rec["checks"] = sum(counts.get(k, 0) for k in ("same", "within-ulps", "differs", "varies"))
            rec["check_ms"] = counts.get("check_ms", 0)
            rec["shim_checks"] = counts.get("shim_checks")
            if cmp["verdict"] not in MATCHED:  # what it printed last: a crash's message is the evidence
                rec.update(excluded=f"output {cmp['verdict']}", stderr_tail=run["stderr_tail"][-500:])
    return records


def cost_summary(records: list[dict], reps: int, env: dict[str, str]) -> dict:
    """The kept runs' wall seconds per side: lists, medians, spread, checked / unchecked medians."""
    out: dict = {"reps": reps, "runs": records, **({"with": env} if env else {})}
    for side in COST_SIDES + ((ALSO,) if env else ()):
        kept = [r for r in records if r["side"] == side and "excluded" not in r]
        secs = [r["seconds"] for r in kept]
        out[f"{side}_s"] = secs
        out[f"{side}_median_s"] = round(statistics.median(secs), 3) if secs else None
        out[f"{side}_min_s"], out[f"{side}_max_s"] = (min(secs), max(secs)) if secs else (None, None)
        out[f"{side}_excluded"] = sum(r["side"] == side and "excluded" in r for r in records)
    checked = [r for r in records if r["side"] == "check" and "excluded" not in r]
    out["checks"] = [r["checks"] for r in checked]
    out["check_ms"] = [r["check_ms"] for r in checked]
    out["shim_check_ms"] = [(r.get("shim_checks") or {}).get("ms", 0) for r in checked]
    out["phases_ms"] = [(r.get("shim_checks") or {}).get("phases") for r in checked]
    c, n = out["check_median_s"], out["nocheck_median_s"]
    out["ratio"] = round(c / n, 4) if c and n else None  # > 1: the check cost that much of the cold run
    if env:
        a = out[f"{ALSO}_median_s"]
        out["ratio_with"] = round(a / n, 4) if a and n else None
        out["checks_with"] = [r["checks"] for r in records if r["side"] == ALSO and "excluded" not in r]
    return out


def measure_cost(program: dict, recipe: str, scratch: Path, res: dict, again: dict | None, ctx: Context) -> dict:
    """res["cost"][recipe]: the cost runs when default-cold's output matched native, else why not."""
    cold = res["verdicts"].get(recipe, {}).get("default-cold")
    if cold is None:
        return {"skipped": "no default-cold run (--modes)"}
    if cold["verdict"] not in MATCHED:
        return {"skipped": f"default-cold {cold['verdict']}"}
    return cost_summary(cost_runs(program, recipe, scratch, res["native"][recipe], again, ctx), ctx.cost_reps,
                        ctx.cost_env)


def verdict(native: dict, run: dict, compare: corpus.Comparison | None) -> str:
    if run["rc"] == "timeout":
        return "TIMEOUT"
    if native["rc"] != 0:
        return "native-failed"
    if run["rc"] != native["rc"]:
        return "CRASH"
    assert compare is not None
    return {"same": "ok", "close": "close", "unstable": "unstable", "differs": "DIFF"}[compare.verdict]


def compare_runs(program: dict, native: dict, native2: dict | None, run: dict, ctx: Context) -> dict:
    patterns, strip = corpus.mask_patterns(ctx.doc, program), corpus.strip_patterns(program)
    a = corpus.mask_lines(native["stdout"], patterns, strip)
    b = corpus.mask_lines(run["stdout"], patterns, strip)
    unstable: set[int] = set()
    native_unstable = False
    if native2 is not None:
        a2 = corpus.mask_lines(native2["stdout"], patterns, strip)
        unstable = corpus.unstable_lines(a, a2)
        native_unstable = a != a2
    cmp = corpus.compare(a, b, program.get("rtol", DEFAULT_RTOL), unstable, native_unstable)
    return {"verdict": verdict(native, run, cmp), "max_rel": cmp.max_rel, "diff": cmp.diff,
            "ignored_lines": sorted(unstable), "kernels_run": run.get("kernels_run"), "report": run.get("report")}


def run_program(program: dict, ctx: Context) -> dict:
    name = program["name"]
    scratch = ctx.out / "scratch" / name
    res: dict = {"name": name, "suite": program["suite"], "tags": program["tags"], "args": program["args"],
                 "builds": ctx.manifest.get("programs", {}).get(name, {}), "native": {}, "tool": {}, "verdicts": {}}
    t0 = time.monotonic()
    for recipe in corpus.RECIPES:
        if built(ctx, name, recipe):
            res["native"][recipe] = native_run(program, recipe, ctx)
    again: dict[str, dict] = {}
    for recipe, second in AGAIN.items():
        if recipe in res["native"]:
            again[recipe] = res["native"][second] = native_run(program, recipe, ctx)
    native2 = again.get("recommended")
    if "plain" in res["native"] and "recommended" in res["native"]:
        # does embedding bitcode change the program? (it must not)
        res["verdicts"]["plain-vs-recommended"] = compare_runs(
            program, res["native"]["plain"], native2, res["native"]["recommended"], ctx)
    for recipe in TOOL_RECIPES:
        if recipe not in res["native"] or ctx.native_only:
            continue
        if res["native"][recipe]["rc"] == "timeout":
            # the tool would wait out the same timeout three times over
            res["verdicts"][recipe] = {m: {"verdict": "native-timeout"} for m in MODES + EXTRA_MODES}
            continue
        runs = res["tool"][recipe] = tool_runs(program, recipe, scratch, ctx)
        if runs["rewrite"]["rc"] != 0:
            res["verdicts"][recipe] = {m: {"verdict": "REWRITE-FAILED"} for m in MODES + EXTRA_MODES}
            continue
        res["verdicts"][recipe] = {m: {**compare_runs(program, res["native"][recipe], again.get(recipe), runs[m], ctx),
                                       "report": runs[m]["report"]} for m in MODES + EXTRA_MODES}
        for m in MODES + EXTRA_MODES:  # what the check found, and the run's time against native
            v = res["verdicts"][recipe][m]
            if runs[m].get("validation") is not None:
                v["validation"] = runs[m]["validation"]
            v["seconds"], v["native_seconds"] = runs[m].get("seconds"), res["native"][recipe]["seconds"]
        if ctx.speed_reps:
            res.setdefault("speed", {})[recipe] = measure_speed(program, recipe, scratch, res, again.get(recipe), ctx)
        if ctx.cost_reps:
            res.setdefault("cost", {})[recipe] = measure_cost(program, recipe, scratch, res, again.get(recipe), ctx)
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["note"] = "; ".join(filter(None, [note(res), program.get("note", "")]))
    for runs in [res["native"], *res["tool"].values()]:  # keep the JSON readable: ends only
        for r in runs.values():
            r["stdout_tail"] = r.pop("stdout")[-TAIL:]
    return res


def note(res: dict) -> str:
    """One line for the table: what went wrong first, or what is worth knowing."""
    parts = []
    for recipe in ("plain", "recommended", "fembed-bitcode", "nvcc"):
        b = res["builds"].get(recipe)
        if b and b.get("status") != "ok" and recipe != "fembed-bitcode":
            parts.append(f"{recipe} build failed: {b.get('error', '?')[:80]}")
    for recipe, runs in res["tool"].items():
        if runs["rewrite"]["rc"] != 0:
            last = (runs["rewrite"]["stderr_tail"].strip().splitlines() or [""])[-1]
            parts.append(f"{recipe}: rewrite rc {runs['rewrite']['rc']}: {last[:120]}")
    rec = res["verdicts"].get("recommended") or res["verdicts"].get("nvcc") or {}
    for mode, v in rec.items():
        failures = (v.get("report") or {}).get("failures")
        if failures:
            parts.append(f"{mode} failures: " + ", ".join(f"{k} x{n}" for k, n in failures.items()))
            break
    for recipe, native in res["native"].items():
        if native["rc"] == "timeout":
            parts.append(f"{recipe} native run timed out")
    pvr = res["verdicts"].get("plain-vs-recommended", {}).get("verdict")
    if pvr not in (None, "ok"):
        parts.append(f"plain vs recommended natively: {pvr}")
    if any(v.get("verdict") == "unstable" for v in rec.values()):
        parts.append("native runs disagree with each other")
    return "; ".join(parts)


# --- the report -----------------------------------------------------------------------------

def stamp(ctx: Context, args: argparse.Namespace) -> dict:
    return {"tool_commit": tool_commit(ctx.tool), "tool_version": harness.first_line([*ctx.tool, "--version"]),
            "gpu": gpu_info(args.nvidia_smi), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]), "host": os.uname().nodename,
            "hecbench_commit": ctx.manifest.get("hecbench_commit"), "clang": ctx.manifest.get("clang"),
            **({"nvcc": ctx.manifest["nvcc"]} if ctx.manifest.get("nvcc") else {}), "timeout_s": ctx.timeout}


def tool_commit(tool: list[str]) -> str:
    """The tool's git commit: $PROTEUS_COMMIT where the caller names it (a GPU host's copy of
    the tree may carry a stale .git), else from the checkout the tool (a venv's bin/ inside it)
    or this script lives in."""
    if os.environ.get("PROTEUS_COMMIT"):
        return os.environ["PROTEUS_COMMIT"]
    candidates = []
    found = shutil.which(tool[0])
    if found:
        candidates.append(Path(found).resolve().parent)
    candidates.append(HERE)
    for where in candidates:
        try:
            proc = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            break
        if proc.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True).stdout.strip()
            return proc.stdout.strip() + ("+dirty" if dirty else "")
    return "unknown"


def gpu_info(nvidia_smi: str) -> str:
    return harness.gpu_name(nvidia_smi) or "unknown"


def share_text(v: dict | None) -> str:
    report = (v or {}).get("report") or {}
    if report.get("share") is None:
        return "-"
    return f"{report['specialized_launches']}/{report['launches']} ({100 * report['share']:.0f}%)"


def markdown(results: list[dict], header: dict) -> str:
    lines = ["# HeCBench differential test of proteus-rewrite", "",
             *[f"- {k}: `{v}`" for k, v in header.items()], "",
             "Verdicts, per mode (sync-cold / default-cold / default-warm), against the native run of the same binary: "
             "ok = same output after masking; close = numbers within rtol; unstable = the native runs disagree too; "
             "DIFF; CRASH = another exit code; TIMEOUT; REWRITE-FAILED; native-timeout / native-failed = nothing to compare "
             "with; `-` = not built.", ""]
    lines += summary(results) + [""]
    lines += ["| program | suite | tags | specialized (sync-cold) | recommended | exact-fp | fembed-bitcode | shared-lib "
              "| nvcc | specialized (nvcc, sync-cold) | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rec, fem = r["verdicts"].get("recommended"), r["verdicts"].get("fembed-bitcode")
        cells = [r["name"], r["suite"], ", ".join(r["tags"]), share_text((rec or {}).get("sync-cold")),
                 _modes_cell(rec), _modes_cell(r["verdicts"].get("exact-fp"), r["builds"].get("exact-fp")),
                 _modes_cell(fem, r["builds"].get("fembed-bitcode")),
                 _modes_cell(r["verdicts"].get("shared-lib"), r["builds"].get("shared-lib")),
                 _modes_cell(r["verdicts"].get("nvcc"), r["builds"].get("nvcc")),
                 share_text((r["verdicts"].get("nvcc") or {}).get("sync-cold")), r["note"].replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += kernels_table(results)
    lines += check_table(results)
    lines += validation_table(results)
    lines += speed_table(results)
    lines += cost_table(results)
    return "\n".join(lines) + "\n"


def kernels_table(results: list[dict]) -> list[str]:
    """--kernel-trace: per program and recipe, the launches the GPU ran as variants and as
    originals in each mode, by CUPTI, beside the launches the shim's report says it specialized."""
    rows = []
    for r in results:
        for recipe, verdicts in r["verdicts"].items():
            cells = []
            for mode in MODES:
                v = (verdicts or {}).get(mode) or {}
                k = v.get("kernels_run")
                if k is None:
                    cells.append("-")
                    continue
                rep = v.get("report") or {}
                cells.append(f"{k['variants']} / {k['originals']} ({rep.get('specialized_launches', '-')} by the report)")
            if any(c != "-" for c in cells):
                rows.append(f"| {r['name']} | {recipe} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "## What the GPU ran (CUPTI)", "",
            "Kernel launches executed as variants / as originals, from CUPTI's activity records (--kernel-trace).", "",
            "| program | recipe | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES), *rows]


def check_table(results: list[dict]) -> list[str]:
    """The default check: per program and recipe, what it found in the cold runs (variants
    matched, denied kernels, not compared and why) and, with --check-cost, the default cold run's
    wall time against the same run without the check."""
    rows = []
    for r in results:
        for recipe, verdicts in r["verdicts"].items():
            if not isinstance(verdicts, dict):
                continue
            cold, off = verdicts.get("default-cold") or {}, verdicts.get(NOCHECK) or {}
            counts = [(verdicts.get(m) or {}).get("validation") for m in ("sync-cold", "default-cold")]
            counts = [c for c in counts if isinstance(c, dict)]
            if not counts and not off:
                continue
            matched = max((c["same"] + c["within-ulps"] for c in counts), default=0)
            denied = sorted({k for c in counts for k in c["differing_kernels"]})
            unchecked = sorted({x for c in counts for x in c["skip_reasons"] + [f"varies: {k}" for k in c["varying_kernels"]]})
            cost = "-"
            if cold.get("seconds") is not None and off.get("seconds") is not None:
                cost = f"{cold['seconds']:.2f} / {off['seconds']:.2f}" + (f" ({cold['seconds'] / off['seconds']:.2f}x)"
                                                                         if off["seconds"] > 0 else "")
            rows.append(f"| {r['name']} | {recipe} | {matched} | {'; '.join(denied) or '-'} | "
                        + ("; ".join(unchecked).replace("|", "\\|")[:160] or "-") + f" | {cost} |")
    if not rows:
        return []
    return ["", "## The default check", "",
            "Variants whose first launch matched the original's (the most over the two cold modes), kernels the check "
            "denied, variants it could not compare and why; with --check-cost, the default cold run's wall seconds "
            f"against the same cold run with PROTEUS_VALIDATE=0 ({NOCHECK}; one run each, beside the other programs).", "",
            "| program | recipe | matched | denied | not compared | cold s: checked / unchecked |", "|---|---|---|---|---|---|",
            *rows]


def validation_table(results: list[dict]) -> list[str]:
    """--validate: per program and recipe, the checked variants and the run's cost against native."""
    rows = []
    for r in results:
        for recipe, verdicts in r["verdicts"].items():
            v = verdicts.get(VALIDATE) if isinstance(verdicts, dict) else None
            if not v or not isinstance(v.get("validation"), dict):
                continue
            c = v["validation"]
            ratio = f"{v['seconds'] / v['native_seconds']:.2f}x" if v.get("native_seconds") else "-"
            rows.append(f"| {r['name']} | {recipe} | {v['verdict']} | {c['same'] + c['within-ulps']} | {c['differs']} | "
                        f"{c['skipped'] + c.get('varies', 0)} | {c['check_ms']} | {v['seconds']} | {v.get('native_seconds')} | {ratio} | "
                        + "; ".join(c["differing_kernels"] + [f"varies: {k}" for k in c.get("varying_kernels", [])]
                                    + c["skip_reasons"]).replace("|", "\\|")[:200] + " |")
    if not rows:
        return []
    return ["", "## Under validation (PROTEUS_VALIDATE=1, every variant checked on its first launch)", "",
            "Output against native as above; variants that matched their original, differed (denied), were not "
            "checked (skipped, or the original's own two runs disagreed: 'varies'); the checks' own time; the run's "
            "wall time against the native run's.", "",
            "| program | recipe | output | matched | differed | not checked | check ms | run s | native s | run / native "
            "| kernels, reasons |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def _ms(median: float | None, lo: float | None, hi: float | None) -> str:
    return "-" if median is None else f"{median:.3f} [{lo:.3f}-{hi:.3f}]"


def _span(values: list[int]) -> str:
    return "-" if not values else str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def speed_table(results: list[dict]) -> list[str]:
    """--speed-reps: per program and recipe, the GPU kernel time (CUPTI, all kernels summed) of the
    native runs and of the default-warm runs, and the summary per recipe."""
    rows = []
    for r in results:
        for recipe, s in (r.get("speed") or {}).items():
            if "skipped" in s:
                rows.append(f"| {r['name']} | {recipe} | - | - | - | - | - | not measured: {s['skipped']} |")
                continue
            excluded = [f"{x['side']} #{x['rep']}: {x['excluded']}" for x in s["runs"] if "excluded" in x]
            excluded_cell = (f"{len(excluded)}: " + "; ".join(excluded))[:200].replace("|", "\\|") if excluded else ""
            speedup = "-" if s["speedup"] is None else f"{s['speedup']:.3f}x"
            steady = "-" if s.get("steady_speedup") is None else f"{s['steady_speedup']:.3f}x"
            rows.append(f"| {r['name']} | {recipe} | {_ms(s['native_median_ms'], s['native_min_ms'], s['native_max_ms'])} | "
                        f"{_ms(s['warm_median_ms'], s['warm_min_ms'], s['warm_max_ms'])} | {speedup} | {steady} | "
                        f"{_span(s['warm_variant_launches'])}/{_span(s['warm_launches'])} | "
                        f"{excluded_cell} |")
    if not rows:
        return []
    return ["", "## GPU kernel time, native vs default-warm (CUPTI)", "",
            "Per run, the GPU time of every kernel it launched summed (CUPTI activity records, variants and "
            "originals alike); runs alternate native / default-warm (the cache default-cold left). Median [min-max] "
            "over the runs kept: a run whose output differs from the native reference, or that failed or left no "
            "timed trace, is excluded (named in the last column). speed-up = native median / warm median (> 1: "
            "faster under the tool); the same without each kernel's first launch (its variant's counted as "
            "its own), medians of the runs' remainders; launches per warm run, those that ran a variant first.", "",
            *speed_summary_lines(results), "",
            "| program | recipe | native ms | warm ms | speed-up | without first launches | variant launches/launches | "
            "excluded |",
            "|---|---|---|---|---|---|---|---|", *rows]


def cost_table(results: list[dict]) -> list[str]:
    """--check-cost-reps: per program and recipe, the cold run's wall seconds with the default
    check and without it, the checks made and their own time, and how many programs the check
    costs more than 5%."""
    rows, ratios, ratios_with, env = [], [], [], {}
    for r in results:
        for recipe, s in (r.get("cost") or {}).items():
            if "skipped" in s:
                rows.append(f"| {r['name']} | {recipe} | - | - | - | - | - | - | - | - | - | not measured: {s['skipped']} |")
                continue
            env = s.get("with") or env
            if s.get("ratio_with") is not None:
                ratios_with.append(s["ratio_with"])
            excluded = [f"{x['side']} #{x['rep']}: {x['excluded']}" for x in s["runs"] if "excluded" in x]
            excluded_cell = (f"{len(excluded)}: " + "; ".join(excluded))[:200].replace("|", "\\|") if excluded else ""
            ratio = "-" if s["ratio"] is None else f"{s['ratio']:.3f}x"
            if s["ratio"] is not None:
                ratios.append(s["ratio"])
            also = "- | -" if not s.get("with") else (f"{_s(s, ALSO)} | "
                                                      + ("-" if s["ratio_with"] is None else f"{s['ratio_with']:.3f}x"))
            rows.append(f"| {r['name']} | {recipe} | {_s(s, 'check')} | {_s(s, 'nocheck')} | {ratio} | {also} | "
                        f"{_span(s['checks'])} | {_span(s['check_ms'])} | {_span(s.get('shim_check_ms') or [])} | "
                        f"{_phases(s.get('phases_ms') or [])} | {excluded_cell} |")
    if not rows:
        return []
    def summary(values: list[float]) -> str:
        return (f"{len(values)} programs: median ratio {statistics.median(values):.3f}x, "
                f"{sum(x > 1.05 for x in values)} above 1.05x, worst {max(values):.3f}x") if values else "no program measured"
    settings = " ".join(f"{k}={v}" for k, v in env.items())
    return ["", "## The default check's cost, cold (wall seconds)", "",
            "Per program, cold runs from an empty cache with the default check and with PROTEUS_VALIDATE=0, "
            "alternating, untraced. Median [min-max] over the runs whose output matched native; ratio = checked "
            "median / unchecked median (> 1: what the check cost); checks made and their milliseconds over the "
            "checked runs: the report's per check, the shim's whole (as the budget counts it), and its largest phases "
            "per run (ms, protocol.CHECK_PHASES)." + (f" Beside them, checked with {settings} (its ratio to the "
                                                   "unchecked median)." if env else ""), "",
            f"- default: {summary(ratios)}", *([f"- with {settings}: {summary(ratios_with)}"] if env else []), "",
            "| program | recipe | checked s | unchecked s | ratio | with s | ratio with | checks | check ms | shim ms | "
            "phases | excluded |", "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def _phases(runs: list[dict | None]) -> str:
    """The phases of the checks (the shim's report) summed over the runs, largest first, the top three."""
    total: dict[str, float] = {}
    for phases in runs:
        for k, v in (phases or {}).items():
            total[k] = total.get(k, 0.0) + v
    top = sorted(((v, k) for k, v in total.items() if v > 0), reverse=True)[:3]
    return ", ".join(f"{k} {v / len(runs):.1f}" for v, k in top) if top else "-"


def _s(s: dict, side: str) -> str:
    m = s[f"{side}_median_s"]
    return "-" if m is None else f"{m:.2f} [{s[f'{side}_min_s']:.2f}-{s[f'{side}_max_s']:.2f}]"


def speed_summary_lines(results: list[dict]) -> list[str]:
    """Per recipe: the geometric mean of the speed-ups, how many are below 0.99 and at or above
    1.10, and the five worst."""
    out = []
    recipes = [rc for rc in TOOL_RECIPES if any(rc in (r.get("speed") or {}) for r in results)]
    for recipe in recipes:
        ups = [(r["name"], r["speed"][recipe]["speedup"]) for r in results
               if (r.get("speed") or {}).get(recipe, {}).get("speedup")]
        unmeasured = sum(1 for r in results if recipe in (r.get("speed") or {})) - len(ups)
        if not ups:
            out.append(f"- {recipe}: no speed-up measured ({unmeasured} not measured)")
            continue
        geomean = math.exp(sum(math.log(x) for _, x in ups) / len(ups))
        worst = ", ".join(f"{n} {x:.3f}x" for n, x in sorted(ups, key=lambda t: t[1])[:5])
        out.append(f"- {recipe}: geomean speed-up {geomean:.3f}x over {len(ups)} programs; "
                   f"{sum(x < 0.99 for _, x in ups)} below 0.99, {sum(x >= 1.10 for _, x in ups)} at or above 1.10; "
                   f"worst: {worst}" + (f"; {unmeasured} not measured" if unmeasured else ""))
    return out


def _modes_cell(verdicts: dict | None, build: dict | None = None) -> str:
    if not verdicts:
        if build and build.get("status") == "failed":
            return "not built: " + build.get("error", "")[:90].replace("|", "\\|")
        return "-"
    return " / ".join(verdicts[m]["verdict"] for m in MODES + EXTRA_MODES if m in verdicts)


def summary(results: list[dict]) -> list[str]:
    out = []
    for recipe in TOOL_RECIPES:
        for mode in MODES + EXTRA_MODES:
            counts: dict[str, int] = {}
            for r in results:
                v = r["verdicts"].get(recipe, {}).get(mode)
                if v:
                    counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
            if counts:
                out.append(f"- {recipe} {mode}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return out


# --- the CLI --------------------------------------------------------------------------------

def shard(programs: list[dict], spec: str, parser: argparse.ArgumentParser) -> list[dict]:
    """Every N-th program from the I-th: slices of similar mix (the slow paper programs
    come first and are spread out)."""
    try:
        i, n = (int(x) for x in spec.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        parser.error(f"--shard {spec!r}: expected I/N with 1 <= I <= N")
    return programs[i - 1::n]


def main(argv: list[str] | None = None) -> int:
    global MODES, EXTRA_MODES  # --modes and --validate choose the runs, for every program alike
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(HERE / "work"), help="the builds and manifest.json (default: %(default)s)")
    parser.add_argument("--out", default="hecbench-results", help="results folder (default: %(default)s)")
    parser.add_argument("--suite", choices=("paper", "corpus", "all"), default="all")
    parser.add_argument("--only", default="", help="comma-separated program names")
    parser.add_argument("-j", "--jobs", type=int, default=4, help="programs in parallel (default 4)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    parser.add_argument("--tool", help="the proteus-rewrite command (default: on PATH or beside this Python)")
    parser.add_argument("--exe", help="run this in place of every program's binary (a fake GPU, for testing)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--recipes", default=",".join(corpus.RECIPES),
                        help="builds to use, comma-separated, from: " + ", ".join(corpus.RECIPES) + " (default: all)")
    parser.add_argument("--shard", default="1/1", metavar="I/N",
                        help="the I-th of N interleaved slices of the programs (runs split over several calls)")
    parser.add_argument("--validate", action="store_true",
                        help="also run each build under PROTEUS_VALIDATE (a fourth mode, 'validate')")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="the tool's modes to run, comma-separated (default: all three)")
    parser.add_argument("--check-cost", action="store_true",
                        help="also run each program cold without the default check (PROTEUS_VALIDATE=0): its cost")
    parser.add_argument("--kernel-trace", metavar="LIB",
                        help="CUPTI injection library (bench/lib/kernel_trace.c, built): each tool run records the "
                             "kernels the GPU ran, variants and originals")
    parser.add_argument("--speed-reps", type=int, default=0, metavar="N",
                        help="after a build's checks, where default-warm matched native: N native and N default-warm "
                             "runs, alternating, each timed by CUPTI (needs --kernel-trace); the summed GPU kernel "
                             "times, medians and native/warm speed-up go to the results (default 0: off)")
    parser.add_argument("--check-cost-reps", type=int, default=0, metavar="N",
                        help="after a build's checks, where default-cold matched native: N cold runs with the default "
                             "check and N without it, alternating, untraced; wall seconds, medians and the ratio go to "
                             "the results (default 0: off)")
    parser.add_argument("--check-cost-with", action="append", default=[], metavar="PROTEUS_NAME=VALUE",
                        help="with --check-cost-reps: a third side, the default check under these settings (repeatable)")
    parser.add_argument("--native-only", action="store_true",
                        help="native runs only: check the programs themselves (time, stability) without the tool")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: from {', '.join(MODES)}")
    MODES, EXTRA_MODES = modes, ((VALIDATE,) if args.validate else ()) + ((NOCHECK,) if args.check_cost else ())
    if args.check_cost_reps < 0:
        parser.error("--check-cost-reps N: N >= 0")
    if any(not kv.startswith("PROTEUS_") or "=" not in kv for kv in args.check_cost_with):
        parser.error("--check-cost-with: PROTEUS_NAME=VALUE")
    cost_env = dict(kv.split("=", 1) for kv in args.check_cost_with)
    if args.speed_reps < 0 or (args.speed_reps and not args.kernel_trace):
        parser.error("--speed-reps N: N >= 0, and it needs --kernel-trace LIB (the GPU times come from CUPTI)")

    doc = corpus.load_programs(HERE / "programs.json")
    work = Path(args.work).resolve()
    manifest = harness.load_manifest(work, {"programs": {}})
    programs = shard(corpus.select(doc, args.suite, [n for n in args.only.split(",") if n]), args.shard, parser)
    recipes = tuple(r for r in args.recipes.split(",") if r)
    if not set(recipes) <= set(corpus.RECIPES):
        parser.error(f"--recipes: from {', '.join(corpus.RECIPES)}")
    tool = harness.tool_command(args.tool)
    out = Path(args.out).resolve()
    ctx = Context(work, out, tool, str(Path(args.exe).resolve()) if args.exe else None, args.timeout,
                  args.dry_run, args.native_only, recipes, doc, manifest,
                  str(Path(args.kernel_trace).resolve()) if args.kernel_trace else None, args.speed_reps,
                  args.check_cost_reps, cost_env)
    runnable = [p for p in programs if any(built(ctx, p["name"], r) for r in corpus.RECIPES)]
    skipped = sorted(set(p["name"] for p in programs) - set(p["name"] for p in runnable))
    if skipped:
        log(f"not built, skipped: {', '.join(skipped)}")
    if not runnable:
        raise SystemExit(f"nothing to run: no builds under {work} (build.py, or unpack the tarball)")

    results: dict[str, dict] = {}
    header = stamp(ctx, args)

    def one(program: dict) -> None:
        res = run_program(program, ctx)
        with harness.LOCK:
            results[program["name"]] = res
            if not ctx.dry_run:  # after every program: a run cut short keeps what it did
                write_results(out, header, skipped, [results[p["name"]] for p in runnable if p["name"] in results])
        rec = res["verdicts"].get("recommended") or res["verdicts"].get("nvcc") or {}
        what = ("planned" if ctx.dry_run else " / ".join(v["verdict"] for v in rec.values()) or
                "native " + ", ".join(f"{k} rc {r['rc']} {r['seconds']} s" for k, r in res["native"].items()))
        speed = "".join(f"  {recipe} speed-up {s['speedup']:.3f}x" if s.get("speedup") else f"  {recipe} speed: "
                        + s.get("skipped", "not measured") for recipe, s in (res.get("speed") or {}).items())
        log(f"[{len(results)}/{len(runnable)}] {program['name']}: {what}  {share_text(rec.get('sync-cold'))}  "
            f"{res['seconds']} s{speed if not ctx.dry_run else ''}")

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, runnable))
    if not ctx.dry_run:
        log(f"wrote {out / 'hecbench-corpus.md'} and {out / 'hecbench-corpus.json'}")
    return 0


def write_results(out: Path, header: dict, skipped: list[str], results: list[dict]) -> None:
    harness.write_files(out, {
        "hecbench-corpus.json": json.dumps({**header, "skipped": skipped, "programs": results}, indent=1) + "\n",
        "hecbench-corpus.md": markdown(results, header)})


if __name__ == "__main__":
    sys.exit(main())
