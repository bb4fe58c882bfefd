"""The specialization policy on a GPU (issue 10's benchmark), as ratios against native runs
made in the same invocation:

  1. changing_scalars (samples/): a step counter (a new scalar value on every launch), the
     same kernel with a few repeating values, and a step counter whose GPU work dominates:
     native; cold cache with the default settings (PROTEUS_ASYNC_COMPILATION=auto);
     cold with every variant compiled on the launching thread (upstream's synchronous mode:
     PROTEUS_ASYNC_COMPILATION=0); warm cache (default settings, the tracker's saved
     decisions included); cold with upstream's asynchronous compilation (=1). The value tracker
     is what keeps these near native. A control, the shim loaded with PROTEUS_DISABLE=1, shows
     what noise alone reads as. On request (--sample-modes): warm with the compiler loaded
     anyway, cold with the compiler in the app's process, and cold with the tracker's saved
     decisions only (what its learning misses cost).
  2. The benchmark workloads (bench/corpora/apps/), cold cache: the default (auto), synchronous, asynchronous.
  3. The benchmark workloads: cold cache vs a cache prewarmed with `proteus-rewrite prewarm`
     from an earlier run's report.

    python -m bench.policy_bench [--out DIR] [--reps 5] [--scales bench/results/<run>.json]
                                  [--only changing_scalars --sample-modes 'disabled;cold;warm' --configs ...]

Needs samples/build/ and bench/corpora/apps/build/ (samples/build.py, bench/corpora/apps/build.py) and a GPU.
Writes policy-<date>-<gpu>.json and .md to --out (default bench/results). Every run's output
is compared with the native run's: a mismatch is recorded next to the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import run as suite  # app runs, statistics, recording, versions
from bench.lib.paths import RESULTS, ROOT, SAMPLES_BUILD

SAMPLES = SAMPLES_BUILD
def changing_configs(launches: int) -> dict[str, tuple[str, ...]]:
    """changing_scalars' arguments (launches, distinct values, threads[, elements, check every])
    per configuration. The first two update 4,096 elements per launch and check them all on the
    host, whose work then dominates (and varies from run to run with the machine's CPU); the
    third updates 16M elements (64 MB) and checks every 4,096th, so the GPU's work dominates, as
    in a time-stepping code."""
    n = str(launches)
    return {"step counter": (n, n, "1"), "16 repeating values": (n, "16", "1"),
            "step counter, GPU-bound": (n, n, "1", str(1 << 24), "4096")}


def shim_costs(reports: list[dict]) -> dict:
    """Medians over a mode's PROTEUS_REPORTs: where the app waited on the shim, what it compiled."""
    if not reports:
        return {}
    def med(xs):
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 2) if xs else None
    waits = [r.get("shim_wait_ms") or {} for r in reports]
    ks = [r.get("kernels", []) for r in reports]
    return {
        "wait_ms": {f: med([w.get(f) for w in waits])
                    for f in ("python_start", "misses", "prepare_compiler", "exit", "compiling", "compiling_checks")},
        "misses": med([w.get("miss_count") for w in waits]),
        "deferred": med([w.get("deferred_count") for w in waits]),  # of those, kept for the tracker (none before 782747a)
        "compiling_waits": med([w.get("compiling_count") for w in waits]),
        "compiling_checks": med([w.get("compiling_check_count") for w in waits]),
        "miss_stages": {f: med([(w.get("miss_stages") or {}).get(f) for w in waits])
                        for f in ("lock", "resolve", "gil", "track", "specialize", "queue")},
        "variants_compiled": med([sum(k.get("specializations", 0) for k in kk) for kk in ks]),
        "disk_hits": med([sum(k.get("disk_cache_hits", 0) for k in kk) for kk in ks]),
        "specialized_share": med([sum(k.get("specialized_launches", 0) for k in kk) / max(1, sum(k.get("launches", 0) for k in kk))
                                  for kk in ks]),
        "prestart": reports[0].get("prestart"),
        "threads_ms": {f: med([(r.get("threads_ms") or {}).get(f) for r in reports])
                       for f in ("app_main_wall", "app_main_cpu", "compile_threads_cpu", "prestart_cpu", "after_main", "report")},
    }


DEFAULT_SAMPLE_MODES = ("disabled", "cold", "cold, sync", "warm", "cold, async")
SAMPLE_MODES = (*DEFAULT_SAMPLE_MODES, "warm, compiler loaded", "cold, in-process compiler",
                "cold, tracker learned")  # the last three on request only
WORKLOAD_MODES = ("cold", "cold, sync", "cold, async", "prewarmed")
ALL_WORKLOAD_MODES = (*WORKLOAD_MODES, "cold, in-process compiler")  # the last on request only
COLD_MODES = {  # what each cold mode sets beyond an empty cache; "cold" is the defaults
    "cold": {},
    "cold, sync": {"PROTEUS_ASYNC_COMPILATION": "0"},
    "cold, async": {"PROTEUS_ASYNC_COMPILATION": "1"},
    "cold, in-process compiler": {"PROTEUS_COMPILE_PROCESS": "0"},  # as before the compiler process (4158404)
}
# Over the warm cache: "warm, compiler loaded" warms the compiler up at start (as every run with
# PROTEUS_ASYNC_COMPILATION=0 does, where the app's thread would otherwise compile), which a warm
# run skips after one that compiled nothing: what a cold run pays for the compiler's presence
# (its warm-up beside the context's creation, its pages and destructors at exit) apart from its
# misses and compilations.
WARM_MODES = {"warm": {}, "warm, compiler loaded": {"PROTEUS_ASYNC_COMPILATION": "0"}}
# "cold, tracker learned": each run gets a fresh copy of the warm cache without its variants, the
# value tracker's saved decisions left: a cold run that skips the tracker's learning misses
# (one miss, not T + 2), so its difference to "cold" is what learning costs the app.
LEARNED_MODES = {"cold, tracker learned": {}}


def policies_only(src: Path, dst: Path) -> None:
    """A copy of the cache directory `src` with only the tracker's saved decisions in it."""
    from proteus_rewrite.cache import StorageCache, decode
    from proteus_rewrite.policy import POLICY_KIND

    shutil.copytree(src, dst)
    for path, _ in StorageCache(dst).entries():
        entry = decode(path.read_bytes())
        if entry is None or entry.kind != POLICY_KIND:
            path.unlink()


def segments(r: dict, report: dict) -> dict:
    """Where one run's time went (ms), from the report's timeline (CLOCK_MONOTONIC, as the
    parent's): to the shim's loading (exec, dynamic loading), static initialization (the fat
    binaries' registration), main(), main's return to the report (exit handlers), and the rest
    (the report, destructors, the process's teardown, reaping it)."""
    t = report.get("timeline_ns") or {}
    if not all(t.get(k) for k in ("shim_loaded", "main_start", "main_end", "report")):
        return {}
    points = (r["spawn_ns"], t["shim_loaded"], t["main_start"], t["main_end"], t["report"], r["reaped_ns"])
    return {name: round((b - a) / 1e6, 3) for name, a, b in
            zip(("to_shim", "static_init", "main", "exit_handlers", "teardown"), points, points[1:])}


def mode_env(mode: str, shim: dict, work: Path, tag: str, reused: dict[str, Path]) -> dict:
    """One run's environment: none for native; a mode named in `reused` runs over that cache
    directory with the default settings; a cold mode gets an empty cache of its own and the
    settings COLD_MODES names. Every shim run reports (the control's, where it has one, is a
    few counters and the run's timeline, written without Python)."""
    if mode == "native":
        return {}
    if mode == "disabled":  # the control: the shim loaded, doing nothing (its ratio shows the noise)
        return {**shim, "PROTEUS_DISABLE": "1", "PROTEUS_REPORT": str(work / f"{tag}.json")}
    env = {**shim, "PROTEUS_REPORT": str(work / f"{tag}.json")}
    if mode in reused:
        env["PROTEUS_CACHE_DIR"] = str(reused[mode])
        env.update(WARM_MODES.get(mode, {}))
    elif mode in LEARNED_MODES:
        env["PROTEUS_CACHE_DIR"] = str(work / "cache" / tag)
        policies_only(reused["learned"], work / "cache" / tag)
        env.update(LEARNED_MODES[mode])
    else:
        env["PROTEUS_CACHE_DIR"] = str(work / "cache" / tag)
        env.update(COLD_MODES[mode])
    return env


def paired(walls: dict[int, dict[str, float]], mode: str, resamples: int = 2000) -> dict | None:
    """native / mode within each repetition (run side by side): the median, and a 95% bootstrap
    interval of that median over the repetitions (seeded, so a rerun of the script agrees)."""
    ratios = [w["native"] / w[mode] for w in walls.values() if "native" in w and mode in w]
    if not ratios:
        return None
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return {"median": round(statistics.median(ratios), 3), "ci95": [round(meds[int(0.025 * resamples)], 3),
                                                                   round(meds[int(0.975 * resamples) - 1], 3)],
            "n": len(ratios)}


def run_sample(args: tuple[str, ...], env: dict, timeout: float) -> dict:
    """One run: its wall time, and what the kernel counted for it (CPU time of all its threads,
    context switches: the run is the only child waited for meanwhile)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawn_ns = time.monotonic_ns()  # CLOCK_MONOTONIC, as the shim's report timeline
    t0 = time.perf_counter()
    proc = subprocess.run([str(SAMPLES / "changing_scalars"), *args], capture_output=True, text=True,
                          env={**os.environ, **env, "SAMPLE_TIMES": "1"}, timeout=timeout)
    wall = time.perf_counter() - t0
    reaped_ns = time.monotonic_ns()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    usage = {"user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
             "voluntary_switches": after.ru_nvcsw - before.ru_nvcsw, "involuntary_switches": after.ru_nivcsw - before.ru_nivcsw}
    times = re.search(r"^times: context ([\d.]+) ms, work ([\d.]+) ms, launch calls ([\d.]+) ms, host computation ([\d.]+) ms, "
                      r"launch calls over 0.2 ms (\d+) taking ([\d.]+) ms, longest ([\d.]+) ms$", proc.stderr, re.M)
    phases = ({"context_s": float(times[1]) / 1e3, "work_s": float(times[2]) / 1e3, "launch_calls_s": float(times[3]) / 1e3,
               "host_compute_s": float(times[4]) / 1e3, "slow_launches": int(times[5]), "slow_launches_s": float(times[6]) / 1e3,
               "longest_launch_s": float(times[7]) / 1e3} if times else {})
    return {"ok": proc.returncode == 0, "wall_s": wall, "stdout": proc.stdout, "usage": usage, "phases": phases,
            "spawn_ns": spawn_ns, "reaped_ns": reaped_ns,
            "error": None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-800:]}"}


def record_sample(work: Path) -> Path:
    out = work / "stores" / "changing_scalars"
    proc = subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", str(SAMPLES / "changing_scalars"), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"recording changing_scalars failed: {proc.stderr.strip()[-800:]}")
    return out


def changing_scalars(work: Path, reps: int, launches: int = 20000, modes: tuple[str, ...] = DEFAULT_SAMPLE_MODES,
                     configs: tuple[str, ...] | None = None) -> dict:
    shim = {"LD_PRELOAD": str(record_sample(work) / "libproteus.so")}
    out = {}
    for name, args in changing_configs(launches).items():
        if configs is not None and name not in configs:
            continue
        ref = run_sample(args, {}, 300)
        if not ref["ok"]:
            raise RuntimeError(f"changing_scalars {' '.join(args)} failed natively: {ref['error']}")
        slug = name.replace(", ", "-").replace(" ", "_")  # every configuration its own cache directories
        warm_dir = work / "cache" / f"changing-{slug}-warm"
        run_sample(args, {**shim, "PROTEUS_CACHE_DIR": str(warm_dir)}, 300)  # fills the warm cache
        times = {m: [] for m in ("native", *modes)}
        reports = {m: [] for m in times}
        usage = {m: [] for m in times}
        parts = {m: [] for m in times}   # segments() of each shim run
        detail = {m: [] for m in times}  # each run: its repetition, wall time, phases, segments
        walls: dict[int, dict[str, float]] = {}
        phase_walls: dict[str, dict[int, dict[str, float]]] = {"context_s": {}, "work_s": {}, "launch_calls_s": {},
                                                               "host_compute_s": {}}
        mismatches = []
        order = random.Random(f"changing-{slug}")
        for rep in range(reps):  # interleaved, so drift hits every mode alike
            for mode in order.sample(list(times), len(times)):  # in a new order each time: no mode always follows another
                env = mode_env(mode, shim, work, f"changing-{slug}-{mode}-{rep}".replace(", ", "-"),
                               {**{m: warm_dir for m in WARM_MODES}, "learned": warm_dir})
                r = run_sample(args, env, 300)
                if not r["ok"] or r["stdout"] != ref["stdout"]:
                    mismatches.append({"mode": mode, "rep": rep, "error": r["error"] or "output differs from native"})
                    continue
                times[mode].append(r["wall_s"])
                usage[mode].append(r["usage"])
                walls.setdefault(rep, {})[mode] = r["wall_s"]
                for phase, t in r["phases"].items():
                    if phase in phase_walls:
                        phase_walls[phase].setdefault(rep, {})[mode] = t
                seg = {}
                if "PROTEUS_REPORT" in env and (mode != "disabled" or Path(env["PROTEUS_REPORT"]).exists()):
                    # (disabled, the CUDA shim registers no kernel, and a process without kernels writes no report)
                    report = json.loads(Path(env["PROTEUS_REPORT"]).read_text())
                    if (seg := segments(r, report)):
                        parts[mode].append(seg)
                    if mode != "disabled":
                        reports[mode].append(report)
                detail[mode].append({"rep": rep, "wall_s": round(r["wall_s"], 4),
                                     **{k: round(v, 4) for k, v in r["phases"].items()}, **seg})
        med = {m: suite.stats(t) for m, t in times.items()}
        native = med["native"].get("median")
        k = (reports["cold"][:1] or [{}])[0].get("kernels", [{}])[0]  # the first cold run's kernel
        out[name] = {
            "args": list(args), "modes": med, "mismatches": mismatches,
            "speedup": {m: round(native / s["median"], 3) for m, s in med.items() if m != "native" and s and native},
            "cold_report": {f: k.get(f) for f in ("launches", "specialized_launches", "specializations", "compile_ms", "tracker")},
            "shim": {m: shim_costs(rs) for m, rs in reports.items() if rs},
            # where each shim run's time went (segments()), medians per mode
            "segments_ms": {m: {f: round(statistics.median(p[f] for p in ps), 2) for f in ps[0]} for m, ps in parts.items() if ps},
            "runs": detail,
            # the sample's own split of its time (SAMPLE_TIMES), medians per mode
            "split": {m: {f: round(statistics.median(d[f] for d in ds), 4) for f in
                          ("context_s", "work_s", "launch_calls_s", "host_compute_s", "slow_launches", "slow_launches_s",
                           "longest_launch_s")}
                      for m, ds in detail.items() if ds and "launch_calls_s" in ds[0]},
            # the process's CPU (all threads) and context switches, medians per mode
            "usage": {m: {f: round(statistics.median(u[f] for u in us), 3) for f in us[0]} for m, us in usage.items() if us},
            # each mode against the native run of the same repetition (run next to it)
            "paired": {m: p for m in modes if (p := paired(walls, m))},
            # the same for the sample's own phases (SAMPLE_TIMES): creating the CUDA context, then
            # the work, where every launch, miss and wait of the shim falls; Python's start and
            # the exit drain fall outside both, in the whole run's figure above
            "paired_phases": {ph: {m: p for m in modes if (p := paired(pw, m))} for ph, pw in phase_walls.items() if pw},
        }
        suite.log(f"changing_scalars {name}: " + ", ".join(f"{m} {v}x" for m, v in out[name]["speedup"].items()))
    return out


def workloads(work: Path, scales: dict, reps: int, timeout: float, modes: tuple[str, ...] = WORKLOAD_MODES) -> dict:
    out = {}
    for app, scale in scales.items():
        store = suite.record(app, work)
        shim = {"LD_PRELOAD": str(store / "libproteus.so")}
        ref = suite.run_app(app, {}, scale, timeout)
        if not ref["ok"]:
            out[app] = {"error": f"native run failed: {ref.get('error')}"}
            continue
        # the report of a cold run, and a cache prewarmed from it
        report = work / f"{app}-report.json"
        suite.run_app(app, {**shim, "PROTEUS_CACHE_DIR": str(work / "cache" / f"{app}-first"), "PROTEUS_REPORT": str(report)},
                      scale, timeout)
        prewarmed = work / "cache" / f"{app}-prewarmed"
        t0 = time.perf_counter()
        pre = subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", "prewarm", str(store), "--from", str(report),
                              "--cache-dir", str(prewarmed)], capture_output=True, text=True, cwd=ROOT) if "prewarmed" in modes else None
        prewarm_s = time.perf_counter() - t0
        times = {m: [] for m in ("native", *modes)}
        walls: dict[int, dict[str, float]] = {}
        reports = {m: [] for m in times}
        mismatches, bit_differences = [], []
        order = random.Random(f"workload-{app}")
        for rep in range(reps):
            for mode in order.sample(list(times), len(times)):  # in a new order each time: no mode always follows another
                env = mode_env(mode, shim, work, f"{app}-{mode}-{rep}".replace(", ", "-"), {"prewarmed": prewarmed})
                r = suite.run_app(app, env, scale, timeout)
                verified = r["ok"] and all(v.get("ok") for v in (r.get("verify") or {}).values())
                if not r["ok"] or (r["checksums"] != ref["checksums"] and not verified):
                    mismatches.append({"mode": mode, "rep": rep, "error": r.get("error") or "checksums differ from native",
                                       "verify": r.get("verify")})
                elif r["checksums"] != ref["checksums"]:  # last bits (README: folding FP scalars); the app's check passed
                    bit_differences.append({"mode": mode, "rep": rep, "verify": r.get("verify")})
                if r["ok"]:
                    times[mode].append(r["wall_s"])
                    walls.setdefault(rep, {})[mode] = r["wall_s"]
                    if mode != "native" and Path(env["PROTEUS_REPORT"]).exists():
                        reports[mode].append(json.loads(Path(env["PROTEUS_REPORT"]).read_text()))
        med = {m: suite.stats(t) for m, t in times.items()}
        native = med["native"].get("median")
        out[app] = {"scale": scale, "modes": med, "mismatches": mismatches, "bit_differences": bit_differences,
                    "shim": {m: shim_costs(rs) for m, rs in reports.items() if rs}, "prewarm_s": round(prewarm_s, 3),
                    "prewarm_output": pre.stderr.strip().splitlines()[-1:] if pre and pre.stderr else [],
                    "speedup": {m: round(native / s["median"], 3) for m, s in med.items() if m != "native" and s and native},
                    "paired": {m: p for m in modes if (p := paired(walls, m))}}
        suite.log(f"{app}: " + ", ".join(f"{m} {v}x" for m, v in out[app]["speedup"].items()))
    return out


def _x(v) -> str:
    return f"{v}×" if v is not None else "—"


def _p(r: dict, mode: str, phase: str | None = None) -> str:
    """A paired ratio with its interval: 1.01× [0.99–1.03]; of the whole run, or of a phase."""
    p = ((r.get("paired_phases") or {}).get(phase) or {} if phase else r.get("paired") or {}).get(mode)
    return f"{p['median']}× [{p['ci95'][0]}–{p['ci95'][1]}]" if p else "—"


def _section(title: str, intro: str, columns: tuple[str, ...]) -> list[str]:
    """A subsection's heading, its explanation and a table header: two text columns, then numbers."""
    return ["", title, "", intro, "", "| " + " | ".join(columns) + " |", "|---|---|" + "---:|" * (len(columns) - 2)]


def paired_differences(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per mode, the median of (mode - native) within each repetition, in ms: the whole run, the
    context, the work, the launch calls and the rest (the run outside the two phases)."""
    native = {x["rep"]: x for x in runs.get("native", []) if "context_s" in x}

    def parts(x: dict) -> dict[str, float]:
        return {"run": x["wall_s"], "context": x["context_s"], "work": x["work_s"], "launch calls": x["launch_calls_s"],
                "the rest": x["wall_s"] - x["context_s"] - x["work_s"]}

    out = {}
    for mode, xs in runs.items():
        pairs = [(parts(x), parts(native[x["rep"]])) for x in xs if mode != "native" and x["rep"] in native and "context_s" in x]
        if pairs:
            out[mode] = {f: round(1e3 * statistics.median(m[f] - n[f] for m, n in pairs), 2) for f in pairs[0][0]}
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Specialization policy on {doc['environment'].get('gpu', 'the GPU')}, {doc['date']}", "",
             f"Command: `{doc['command']}`", "",
             "Speedup: native median wall time / the mode's median. Paired: native / mode within each repetition "
             "(the modes run interleaved, each next to a native run), the median over repetitions and its 95% "
             "bootstrap interval; it is the figure to read, since these machines' runs vary by 10-40% "
             "from one to the next. Paired, context / work: the same for the two phases changing_scalars times "
             "itself (SAMPLE_TIMES=1): creating the CUDA context, then the launches, copy back and check, where every "
             "miss and wait of the shim falls (Python's start runs beside the first; the exit drain follows the "
             "second).", "",
             "Modes: disabled = the control, the shim loaded with PROTEUS_DISABLE=1, which does nothing: its "
             "ratio is what noise alone gives; cold = empty cache, default settings; cold, sync = every variant compiled on the launching "
             "thread (PROTEUS_ASYNC_COMPILATION=0, upstream's synchronous mode); warm = a cache an earlier run "
             "filled; warm, compiler loaded = the same cache, the compiler warmed up at start nonetheless "
             "(PROTEUS_ASYNC_COMPILATION=0: what a cold run pays for the compiler's presence beyond its misses and "
             "compilations); cold, in-process compiler = PROTEUS_COMPILE_PROCESS=0 (LLVM and nvJitLink in the app's "
             "process, as before 4158404); cold, tracker learned = an empty cache but for the value tracker's decisions "
             "from an earlier run (one miss where cold has the tracker's T + 2: what learning costs); cold, async = "
             "PROTEUS_ASYNC_COMPILATION=1 (upstream's: never waits for a variant); the default, "
             "auto, compiles in the background too but waits for a variant asked for again while the GPU is busy; "
             "prewarmed = a cache `proteus-rewrite prewarm` "
             "filled from an earlier run's report.", "",
             "## changing_scalars", "",
             "| configuration | mode | native s | speedup | paired | paired: context / work | variants compiled "
             "| specialized launches | mismatches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in doc["changing_scalars"].items():
        for mode in (m for m in r["modes"] if m != "native"):
            c = (r.get("shim") or {}).get(mode) or {}
            share = c.get("specialized_share")
            bad = sum(1 for m in r["mismatches"] if m.get("mode") == mode)
            lines.append(f"| {name} ({' '.join(r['args'])}) | {mode} | {r['modes']['native'].get('median')} | "
                         f"{_x(r['speedup'].get(mode))} | {_p(r, mode)} | {_p(r, mode, 'context_s')} / {_p(r, mode, 'work_s')} | "
                         f"{c.get('variants_compiled', '—')} | "
                         f"{'—' if share is None else f'{100 * share:.1f}%'} | {bad} |")
    lines += _section("### Where the CPU went (medians)",
                      "The process: user and system CPU of all its threads, and its context switches (from the kernel). "
                      "The app's main(): its wall time and its thread's CPU (the shim wraps main; shim runs only). "
                      "The shim's compile threads and prestart thread: their CPU. After main: from main's return to the report.",
                      ("configuration", "mode", "user s", "sys s", "switches vol. / invol.", "main() wall ms", "main() CPU ms",
                       "compile threads CPU ms", "prestart CPU ms", "after main ms"))
    for name, r in doc["changing_scalars"].items():
        for mode, u in (r.get("usage") or {}).items():
            t = ((r.get("shim") or {}).get(mode) or {}).get("threads_ms") or {}
            lines.append(f"| {name} | {mode} | {u['user_s']} | {u['sys_s']} | {u['voluntary_switches']} / {u['involuntary_switches']} | "
                         + " | ".join(str(t.get(f, '—')) for f in ("app_main_wall", "app_main_cpu", "compile_threads_cpu",
                                                                    "prestart_cpu", "after_main")) + " |")
    lines += _section("### Inside the sample (medians, its own clock: SAMPLE_TIMES)",
                      "The CUDA context's creation; the work (launches, copy back, check), split into the launch calls "
                      "and the host's computation between them; the launch calls over 0.2 ms (a stall behind a lock or a "
                      "full queue rather than a slower CPU), their time, and the longest launch call.",
                      ("configuration", "mode", "context ms", "work ms", "launch calls ms", "host computation ms",
                       "launch calls > 0.2 ms", "their ms", "longest ms"))
    for name, r in doc["changing_scalars"].items():
        for mode, x in (r.get("split") or {}).items():
            lines.append(f"| {name} | {mode} | " + " | ".join(
                f"{1e3 * x[f]:.1f}" for f in ("context_s", "work_s", "launch_calls_s", "host_compute_s"))
                + f" | {x['slow_launches']:g} | {1e3 * x['slow_launches_s']:.2f} | {1e3 * x['longest_launch_s']:.2f} |")
    lines += _section("### Against native, run by run (ms)",
                      "Each cell: the median over repetitions of the mode's time minus the native run's in the same "
                      "repetition, for the whole run, the sample's two phases, the launch calls within the work, and "
                      "the rest (the process's start before the context and its end after the work: the shim's "
                      "start-up, exit handlers and teardown). Medians of differences do not add up.",
                      ("configuration", "mode", "run", "context", "work", "launch calls", "the rest"))
    for name, r in doc["changing_scalars"].items():
        for mode, diffs in paired_differences(r.get("runs") or {}).items():
            lines.append(f"| {name} | {mode} | " + " | ".join(f"{diffs[f]:+.1f}" for f in
                                                              ("run", "context", "work", "launch calls", "the rest")) + " |")
    lines += _section("### Where a run's time went (medians, ms; shim runs, from their reports' timelines)",
                      "From the spawn to the shim's loading (exec, dynamic loading); static initialization (the fat "
                      "binaries' registration); main(); from main's return to the report (exit handlers: the compile "
                      "queue's drain); the rest (the report, destructors, the process's teardown).",
                      ("configuration", "mode", "to the shim", "static init", "main()", "exit handlers", "teardown"))
    for name, r in doc["changing_scalars"].items():
        for mode, g in (r.get("segments_ms") or {}).items():
            lines.append(f"| {name} | {mode} | " + " | ".join(str(g.get(f, '—')) for f in
                                                              ("to_shim", "static_init", "main", "exit_handlers", "teardown")) + " |")
    wmodes = doc.get("workload_modes") or WORKLOAD_MODES
    lines += ["", "## Workloads: cold (default, synchronous, asynchronous) vs prewarmed", "",
              "Each cell: speedup of medians; paired median [95% interval].", "",
              "| workload | native s | " + " | ".join(wmodes) + " | prewarm s | mismatches |",
              "|---|---:|" + "---:|" * len(wmodes) + "---:|---:|"]
    for app, r in doc["workloads"].items():
        if "error" in r:
            lines.append(f"| {app} | {r['error'][:80]} |" + " |" * (len(wmodes) + 2))
            continue
        cells = " | ".join(f"{_x(r['speedup'].get(m))}; {_p(r, m)}" for m in wmodes)
        lines.append(f"| {app} | {r['modes']['native'].get('median')} | {cells} | {r['prewarm_s']} | {len(r['mismatches'])} |"
                     + (f" ({len(r['bit_differences'])} runs differ in the last bits, the app's own check passed)"
                        if r.get("bit_differences") else ""))
    lines += ["", "## Where the app waited on the shim (medians of the runs' PROTEUS_REPORTs, ms)", "",
              "Starting Python happens on the shim's prestart thread while the app creates its CUDA context; "
              "\"misses\" is what launches that missed the shim's table waited, that start included where a launch "
              "came before it finished; \"waited for a variant\" is what launches that asked again for a variant "
              "still compiling waited while the GPU was busy (auto), and how many did (and, in parentheses, those "
              "that checked their stream, found it idle and did not wait); the miss count, and in parentheses "
              "those the shim kept for the value tracker without a call into Python; the misses by stage: "
              "the compile lock / resolving a kernel / waiting for Python's GIL (held by the prestart or a compile thread) / "
              "the value tracker / the caches or a compilation / queueing.", "",
              "| run | mode | misses (ms) | miss count | by stage (ms) | waited for a variant (ms; launches) | Python start "
              "| compiler warm-up | exit | variants compiled | disk hits | specialized |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for section in ("changing_scalars", "workloads"):
        for name, r in doc[section].items():
            for mode, c in (r.get("shim") or {}).items():
                if not c:
                    continue
                w = c["wait_ms"]
                share = c.get("specialized_share")
                st = c.get("miss_stages") or {}
                stages = (" / ".join("—" if st.get(f) is None else str(st[f])
                                     for f in ("lock", "resolve", "gil", "track", "specialize", "queue")) if st else "—")
                kept = f" ({c['deferred']})" if c.get("deferred") else ""
                lines.append(f"| {name} | {mode} | {w.get('misses')} | {c.get('misses')}{kept} | {stages} | "
                             f"{w.get('compiling') or 0}; {c.get('compiling_waits') or 0}"
                             + (f" ({w['compiling_checks']}; {c.get('compiling_checks')})" if w.get("compiling_checks") else "")
                             + f" | {w.get('python_start')} | "
                             f"{w.get('prepare_compiler')} | {w.get('exit')} | {c.get('variants_compiled')} | {c.get('disk_hits')} | "
                             f"{'' if share is None else f'{100 * share:.1f}%'} |")
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp_path = path.with_suffix(path.suffix + ".tmp")
    tmp_path.write_text(text)
    tmp_path.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS), help="results directory (default bench/results)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every mode of the workloads (default 5)")
    ap.add_argument("--sample-reps", type=int, default=30,
                    help="repetitions of every mode of changing_scalars, whose 0.5 s runs vary by 10-40%% (default 30)")
    ap.add_argument("--launches", type=int, default=20000, help="changing_scalars' launches per run (default 20000)")
    ap.add_argument("--only", choices=("changing_scalars", "workloads"), help="run one part only")
    ap.add_argument("--sample-modes", default=";".join(DEFAULT_SAMPLE_MODES),
                    help=f"changing_scalars' modes besides native, ';'-separated, of {';'.join(SAMPLE_MODES)} "
                         f"(default {';'.join(DEFAULT_SAMPLE_MODES)})")
    ap.add_argument("--workload-modes", default=";".join(WORKLOAD_MODES),
                    help=f"the workloads' modes besides native, ';'-separated, of {';'.join(ALL_WORKLOAD_MODES)} "
                         f"(default {';'.join(WORKLOAD_MODES)})")
    ap.add_argument("--apps", default=None, help="the workloads to run, ';'-separated (default all)")
    ap.add_argument("--configs", default=None,
                    help="changing_scalars' configurations, ';'-separated (default all: " + "; ".join(changing_configs(1)) + ")")
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    ap.add_argument("--scales", default=None, metavar="RESULT.json",
                    help="a bench/run.py result whose calibrated scales the workloads use (default: the newest in bench/results)")
    ap.add_argument("--run-timeout", type=float, default=120.0)
    ap.add_argument("--render", metavar="RESULT.json", help="write RESULT.md again from RESULT.json (this version's tables); run nothing")
    args = ap.parse_args(argv)
    if args.render:
        src = Path(args.render)
        try:
            doc = json.loads(src.read_text())
            text = markdown(doc)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"policy_bench: {src}: not a policy_bench result ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        _write_atomic(src.with_suffix(".md"), text)
        print(f"policy_bench: wrote {src.with_suffix('.md')}", file=sys.stderr)
        return 0
    modes = tuple(m.strip() for m in args.sample_modes.split(";") if m.strip())
    configs = tuple(c.strip() for c in args.configs.split(";") if c.strip()) if args.configs else None
    wmodes = tuple(m.strip() for m in args.workload_modes.split(";") if m.strip())
    apps = tuple(a.strip() for a in args.apps.split(";") if a.strip()) if args.apps else None
    bad = ([m for m in modes if m not in SAMPLE_MODES] + [c for c in configs or () if c not in changing_configs(1)]
           + [m for m in wmodes if m not in ALL_WORKLOAD_MODES] + [a for a in apps or () if a not in suite.ALL_APPS])
    if bad or not modes or not wmodes:
        print(f"policy_bench: unknown mode, configuration or workload: {', '.join(bad) or '(none given)'}", file=sys.stderr)
        return 2
    if not (SAMPLES / "changing_scalars").exists() or not suite.APPS_DIR.is_dir():
        print("policy_bench: build the samples and the workloads first (samples/build.py, python -m bench.corpora.apps.build)",
              file=sys.stderr)
        return 2
    results = sorted(p for p in RESULTS.glob("20*-*.json") if "nocap" not in p.name)
    scales_from = Path(args.scales) if args.scales else (results[-1] if results else None)
    scales = json.loads(scales_from.read_text())["scales"] if scales_from else {a: 0.3 for a in suite.ALL_APPS}
    env = suite.environment()
    doc = {"benchmark": "specialization policy", "date": datetime.date.today().isoformat(),
           "command": "python -m bench.policy_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
           "environment": env, "scales_from": str(scales_from), "reps": args.reps, "sample_reps": args.sample_reps,
           "workload_modes": list(wmodes)}
    if apps:
        scales = {a: s for a, s in scales.items() if a in apps}
    with tempfile.TemporaryDirectory(prefix="proteus-policy-") as tmp:
        work = Path(tmp)
        doc["changing_scalars"] = (changing_scalars(work, args.sample_reps, args.launches, modes, configs)
                                   if args.only != "workloads" else {})
        doc["workloads"] = workloads(work, scales, args.reps, args.run_timeout, wmodes) if args.only != "changing_scalars" else {}
    base = (f"policy-{doc['date']}-{suite.gpu_tag(env)}" + (f"-{args.only}" if args.only else "")
            + (f"-{args.launches}" if args.launches != 20000 and args.only != "workloads" else "")
            + (f"-{args.tag}" if args.tag else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / f"{base}.json", json.dumps(doc, indent=1) + "\n")
    _write_atomic(out / f"{base}.md", markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
