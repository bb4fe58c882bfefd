"""The benchmark suite on the GPU: native vs JIT (off, cold, warm) per workload and per kernel.

    python -m bench.run [--reps 5] [--apps adam,wsm5] [--scale 1] [--out bench/results] [--time-budget 520]

For each workload of bench/corpora/apps/build/ (built elsewhere by `python -m bench.corpora.apps.build`):
  1. record it with proteus-rewrite into a scratch directory;
  2. calibrate (unless --calibrate 0 or --app-scale pins it): one native run at a fifth of the
     work gives the GPU time per unit of --scale; the app's scale is set so that its kernels
     take --calibrate seconds natively (the scale multiplies repetition counts only, never a
     value the kernels see, so the specializations are the same at every scale);
  3. prime: one native run (the reference checksums), one `off` run and one cold run that fill
     the `off` and `warm` caches;
  4. --reps repetitions, each running every mode once, interleaved so that drifts of the
     machine fall on all modes alike:
       native    the executable alone
       disabled  LD_PRELOAD=libproteus.so with PROTEUS_DISABLE=1 (pure pass-through)
       off       the shim with PROTEUS_SPECIALIZE_ARGS=0, PROTEUS_SPECIALIZE_LAUNCH_BOUNDS=0,
                 PROTEUS_SPECIALIZE_DIMS=0 (the JIT compiles unspecialized kernels: its cost
                 without the benefit), cache primed, as the paper's "JIT without specialization"
       cold      the shim, every specialization on, an empty PROTEUS_CACHE_DIR each repetition
       warm      the shim with the cache of the priming cold run
     Every run's checksums must equal the native ones; a mismatch is recorded and printed loudly.
Also: per-kernel GPU time (the apps' `kernel_ms` lines, CUDA events) per mode; each cold run's
PROTEUS_REPORT (compile ms per kernel, variants and their folded values); compile time per
stage (plan, ir, optimize, ptx, cubin) for every variant the cold run compiled, taken from the
report when it carries them, otherwise by specializing the same variant again in this process;
the hit-path launch overhead (bench/shim_bench.py's launch_overhead, on bench/corpora/apps/build/launch_overhead);
GPU, driver, CUDA, LLVM and tool versions.
Writes <out>/<date>-<gpu>.json (after every workload, so a run cut short leaves its results)
and <out>/<date>-<gpu>.md; `python -m bench.plot` draws the chart from the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.paths import APPS_BUILD as APPS_DIR
from bench.lib.paths import RESULTS, ROOT, SAMPLES_BUILD
from bench.lib.provenance import environment, gpu_tag
from bench.lib.suite_report import PAPER_WARM, STAGES, markdown, write

ALL_APPS = ["adam", "rsbench", "wsm5", "feynman_kac", "lulesh", "sw4ck"]
MODES = ["native", "disabled", "off", "cold", "warm"]
OFF_ENV = {"PROTEUS_SPECIALIZE_ARGS": "0", "PROTEUS_SPECIALIZE_LAUNCH_BOUNDS": "0", "PROTEUS_SPECIALIZE_DIMS": "0"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# one run of one app


def parse_output(stdout: str) -> dict:
    checksums, kernels, verify = {}, {}, {}
    for line in stdout.splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == "checksum":
            checksums[p[1]] = p[2]
        elif len(p) == 4 and p[0] == "kernel_ms":
            kernels[p[1]] = {"ms": float(p[2]), "launches": int(p[3])}
        elif len(p) >= 3 and p[0] == "verify":
            verify[p[1]] = {"ok": p[2] == "ok", "detail": " ".join(p[3:])}
    return {"checksums": checksums, "kernel_ms": kernels, "verify": verify}


def run_app(app: str, env: dict, scale: float, timeout: float) -> dict:
    cmd = [str(APPS_DIR / app), "--scale", f"{scale:g}"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "wall_s": time.perf_counter() - t0, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    out = parse_output(proc.stdout)
    out["wall_s"] = wall
    out["ok"] = proc.returncode == 0
    if proc.returncode != 0:
        out["error"] = f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
    warnings = [l for l in proc.stderr.splitlines() if "proteus" in l.lower()]
    if warnings:
        out["shim_messages"] = warnings[:20]
    return out


def stats(xs: list[float]) -> dict:
    if not xs:
        return {}
    med = statistics.median(xs)
    return {"median": round(med, 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "stdev": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0,
            "spread_pct": round(100 * (max(xs) - min(xs)) / med, 2) if med else None,
            "runs": [round(x, 4) for x in xs]}


# ---------------------------------------------------------------------------------------------
# recording, calibration, stage timings


def record(app: str, work: Path) -> Path:
    out = work / "stores" / app
    proc = subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", str(APPS_DIR / app), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"proteus-rewrite {app} failed: {proc.stderr.strip()[-1500:]}")
    return out


def calibrate(app: str, base_scale: float, target_s: float, timeout: float) -> dict:
    probe = base_scale * 0.2
    r = run_app(app, {}, probe, timeout)
    if not r["ok"]:
        raise RuntimeError(f"calibration run failed: {r.get('error')}")
    gpu_s = sum(k["ms"] for k in r["kernel_ms"].values()) / 1000.0
    per_unit = gpu_s / probe
    scale = base_scale if per_unit <= 0 else min(max(target_s / per_unit, 0.02), 50.0)
    scale = float(f"{scale:.3g}")
    return {"probe_scale": probe, "probe_wall_s": round(r["wall_s"], 3), "probe_gpu_s": round(gpu_s, 4),
            "gpu_s_per_unit_scale": round(per_unit, 4), "scale": scale}


def stage_timings(app: str, report: dict, driver_version: int | None, repeat: int = 3) -> dict:
    """Per variant the cold run compiled: the report's own stage times when it has them,
    otherwise the same variant specialized again here (no cache), median of `repeat`."""
    from proteus_rewrite.fatbin import extract
    from proteus_rewrite.jit import Config, Launch, specialize
    from proteus_rewrite.jit.launch import parse_value

    table = extract(APPS_DIR / app)
    by_name = {k.name: k for k in table.kernels}
    config = Config.from_env({})
    out = {}
    warmed = False
    for entry in report.get("kernels", []):
        kernel = by_name.get(entry.get("name"))
        for v in entry.get("variants", []):
            if v.get("source") != "compiled":
                continue
            name = entry.get("demangled") or entry["name"]
            reported = v.get("timings_ms") or v.get("stages")
            if reported:
                out.setdefault(name, []).append({"source": "report", **{s: reported.get(s) for s in STAGES}})
                continue
            if kernel is None:
                continue
            folded = {int(i): val for i, val in v.get("folded", {}).items()}
            raw, unknown = [], set()
            for p in kernel.params:
                if p.index in folded:
                    val = folded[p.index]
                    text = ("true" if val else "false") if isinstance(val, bool) else repr(val)
                    raw.append(parse_value(p, text))
                else:
                    raw.append(bytes(p.size))
                    unknown.add(p.index)
            launch = Launch(tuple(raw), tuple(v["grid"]), tuple(v["block"]), _sm(driver_version),
                            {g: 0x7F0000000000 + 0x1000 * i for i, g in enumerate(kernel.globals)}, frozenset(unknown))
            if not warmed:  # the first specialization loads libraries
                specialize(table, kernel, launch, config, None, driver_version=driver_version)
                warmed = True
            runs = [specialize(table, kernel, launch, config, None, driver_version=driver_version).timings_ms
                    for _ in range(repeat)]
            out.setdefault(name, []).append({"source": "respecialized here", "folded": v.get("folded"),
                                             **{s: round(statistics.median(r.get(s, 0.0) for r in runs), 2) for s in STAGES}})
    return out


_SM = None


def _sm(driver_version) -> int:
    global _SM
    if _SM is None:
        _SM = 90
        try:
            from cuda.bindings import driver as cu

            cu.cuInit(0)
            _, dev = cu.cuDeviceGet(0)
            _, major = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            _, minor = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            _SM = int(major) * 10 + int(minor)
        except Exception:
            pass
    return _SM


# ---------------------------------------------------------------------------------------------
# one workload


def bench_app(app: str, args, work: Path, scale: float, budget_s: float, doc: dict, driver_version) -> dict:
    res: dict = {"scale": scale, "modes": {}, "failures": [], "checksum_mismatches": []}
    t_start = time.perf_counter()
    store = record(app, work)
    res["record_s"] = round(time.perf_counter() - t_start, 3)
    shim = {"LD_PRELOAD": str(store / "libproteus.so")}
    caches = work / "cache" / app
    env = {
        "native": {},
        "disabled": {**shim, "PROTEUS_DISABLE": "1"},
        "off": {**shim, **OFF_ENV, "PROTEUS_CACHE_DIR": str(caches / "off")},
        "cold": {**shim, "PROTEUS_CACHE_DIR": str(caches / "cold")},
        "warm": {**shim, "PROTEUS_CACHE_DIR": str(caches / "warm")},
    }
    modes = [m for m in MODES if m != "disabled" or not args.no_disabled]

    # priming: the reference, and the caches of `off` and `warm`
    ref = run_app(app, {}, scale, args.run_timeout)
    if not ref["ok"]:
        raise RuntimeError(f"native run failed: {ref.get('error')}")
    res["reference_checksums"] = ref["checksums"]
    res["verify"] = ref["verify"]
    timeout = max(60.0, 8 * ref["wall_s"] + 30)
    for mode, m_env in (("off", env["off"]), ("warm", env["warm"])):
        rep = work / f"{app}-prime-{mode}.json"
        r = run_app(app, {**m_env, "PROTEUS_REPORT": str(rep)}, scale, timeout)
        if not r["ok"] or r["checksums"] != ref["checksums"]:
            res["failures"].append({"mode": f"prime-{mode}", "error": r.get("error", "checksums differ from native"),
                                    "checksums": r.get("checksums")})
        if rep.exists():
            res[f"prime_{mode}_report"] = json.loads(rep.read_text())
    prime_s = time.perf_counter() - t_start

    # repetitions, modes interleaved; fewer when the budget says so
    samples = {m: [] for m in modes}
    kernel = {m: {} for m in modes}
    reports = {"cold": [], "warm": []}
    reps_done = 0
    rep_estimate = sum(ref["wall_s"] for _ in modes) + 0.5 * len(modes)
    for rep in range(args.reps):
        elapsed = time.perf_counter() - t_start
        if rep >= 1 and elapsed + rep_estimate > budget_s:
            res["reps_reduced"] = f"stopped after {rep} of {args.reps} repetitions: time budget ({budget_s:.0f} s for this app)"
            log(f"  {app}: {res['reps_reduced']}")
            break
        t_rep = time.perf_counter()
        for mode in modes:
            m_env = dict(env[mode])
            if mode == "cold":
                shutil.rmtree(caches / "cold", ignore_errors=True)
            if mode in ("cold", "warm"):
                rp = work / f"{app}-{mode}-{rep}.json"
                m_env["PROTEUS_REPORT"] = str(rp)
            r = run_app(app, m_env, scale, timeout)
            if not r["ok"]:
                res["failures"].append({"mode": mode, "rep": rep, "error": r.get("error")})
                log(f"  {app} {mode} rep {rep}: FAILED {r.get('error', '')[:300]}")
                continue
            if r["checksums"] != ref["checksums"]:
                diff = {k: (ref["checksums"].get(k), v) for k, v in r["checksums"].items() if ref["checksums"].get(k) != v}
                res["checksum_mismatches"].append({"mode": mode, "rep": rep, "differ": diff,
                                                   "verify": r["verify"]})
                log(f"  !!! CHECKSUM MISMATCH {app} {mode} rep {rep}: {diff} (app's own check: {r['verify']})")
            samples[mode].append(r["wall_s"])
            for kname, kv in r["kernel_ms"].items():
                kernel[mode].setdefault(kname, {"ms": [], "launches": kv["launches"]})["ms"].append(kv["ms"])
            if mode in ("cold", "warm") and rp.exists():
                reports[mode].append(json.loads(rp.read_text()))
        reps_done = rep + 1
        rep_estimate = time.perf_counter() - t_rep
    res["reps"] = reps_done
    res["modes"] = {m: stats(v) for m, v in samples.items()}
    nat = res["modes"].get("native", {}).get("median")
    res["speedup"] = {m: round(nat / s["median"], 3) for m, s in res["modes"].items()
                      if m != "native" and s and nat}

    # per kernel: GPU ms per mode, kernel speedups, compile times
    kernels = {}
    for mode, ks in kernel.items():
        for kname, kv in ks.items():
            k = kernels.setdefault(kname, {"launches": kv["launches"], "gpu_ms": {}})
            k["gpu_ms"][mode] = stats(kv["ms"])
    for k in kernels.values():
        n = k["gpu_ms"].get("native", {}).get("median")
        k["speedup"] = {m: round(n / s["median"], 3) for m, s in k["gpu_ms"].items() if m != "native" and n and s.get("median")}
    res["kernels"] = kernels
    res["cold_reports"] = [_report_summary(r) for r in reports["cold"]]
    res["warm_reports"] = [_report_summary(r) for r in reports["warm"]]
    compile_ms: dict = {}
    for r in reports["cold"]:
        for k in r.get("kernels", []):
            compile_ms.setdefault(k.get("demangled") or k["name"], []).append(k.get("compile_ms", 0.0))
    res["cold_compile_ms"] = {k: stats(v) for k, v in compile_ms.items()}
    if reports["cold"] and not args.no_stages:
        try:
            res["compile_stages_ms"] = stage_timings(app, reports["cold"][0], driver_version)
        except Exception as exc:
            res["compile_stages_ms"] = {"error": f"{type(exc).__name__}: {exc}"}
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    res["prime_seconds"] = round(prime_s, 1)
    return res


def _report_summary(r: dict) -> dict:
    keep = ("name", "demangled", "launches", "specialized_launches", "table_hits", "specializations",
            "memory_cache_hits", "disk_cache_hits", "compile_ms", "failures", "fallback_launches", "variants")
    return {"seconds": r.get("seconds"), "kernels": [{k: v for k, v in kk.items() if k in keep} for kk in r.get("kernels", [])]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every mode (default 5)")
    ap.add_argument("--apps", default=",".join(ALL_APPS), help=f"comma-separated (default: {','.join(ALL_APPS)})")
    ap.add_argument("--scale", type=float, default=1.0, help="work multiplier for every app (default 1)")
    ap.add_argument("--app-scale", action="append", default=[], metavar="APP=F",
                    help="pin one app's scale (no calibration for it); repeatable")
    ap.add_argument("--calibrate", type=float, default=1.2, metavar="SECONDS",
                    help="scale each app so its kernels take this long natively (default 1.2; 0: off)")
    ap.add_argument("--out", default=str(RESULTS), help="results directory (default bench/results)")
    ap.add_argument("--tag", default=None, help="file name tag (default: from the GPU name, e.g. h100)")
    ap.add_argument("--time-budget", type=float, default=520.0,
                    help="seconds for the whole run (default 520); repetitions are cut to fit, and that is recorded")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds for one run before it counts as failed")
    ap.add_argument("--launch-repeat", type=int, default=5, help="repetitions of the launch-overhead benchmark (0: skip)")
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--no-disabled", action="store_true", help="skip the PROTEUS_DISABLE=1 mode")
    ap.add_argument("--no-stages", action="store_true", help="skip the per-stage compile timings")
    ap.add_argument("--work", default=None, help="scratch directory (default: a new temporary one)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    apps = [a for a in args.apps.split(",") if a]
    unknown = [a for a in apps if a not in ALL_APPS]
    if unknown:
        ap.error(f"unknown app(s): {', '.join(unknown)}")
    pinned = {}
    for item in args.app_scale:
        name, _, value = item.partition("=")
        pinned[name] = float(value)
    work = Path(args.work or tempfile.mkdtemp(prefix="proteus-suite-"))
    work.mkdir(parents=True, exist_ok=True)

    shim = subprocess.run([sys.executable, "-m", "proteus_rewrite.inject.shim"], capture_output=True, text=True, cwd=ROOT)
    if shim.returncode != 0:
        log(f"building libproteus.so failed:\n{shim.stdout}{shim.stderr}")
        return 1
    env = environment()
    driver_version = env.get("cuda_driver_api_int")
    date = time.strftime("%Y-%m-%d")
    base = f"{date}-{args.tag or gpu_tag(env)}"
    doc = {"benchmark": "bench/run.py: native vs proteus-rewrite JIT per workload",
           "command": "python -m bench.run " + " ".join(sys.argv[1:] if argv is None else argv),
           "date": date, "environment": env, "partial": True,
           "settings": {"reps": args.reps, "scale": args.scale, "calibrate_s": args.calibrate, "pinned": pinned,
                        "time_budget_s": args.time_budget, "modes": MODES, "off_env": OFF_ENV},
           "paper_warm_speedup_v100": PAPER_WARM, "apps": {}}
    out = Path(args.out)
    log(f"{env.get('gpu')} driver {env.get('driver')}; results -> {out / base}.json")

    # calibration first, so the budget can be shared out
    scales, calib = {}, {}
    for app in apps:
        if not (APPS_DIR / app).exists():
            doc["apps"][app] = {"error": f"{APPS_DIR / app} not found (run python -m bench.corpora.apps.build)"}
            continue
        if app in pinned or args.calibrate <= 0:
            scales[app] = pinned.get(app, args.scale)
            continue
        try:
            calib[app] = calibrate(app, args.scale, args.calibrate, args.run_timeout)
            scales[app] = calib[app]["scale"]
            log(f"  {app}: calibrated scale {scales[app]:g} ({calib[app]['gpu_s_per_unit_scale']} GPU s per unit)")
        except Exception as exc:
            doc["apps"][app] = {"error": f"calibration: {exc}"}
    doc["calibration"] = calib
    doc["scales"] = scales
    doc["reproduce"] = ("python -m bench.run --calibrate 0 " + " ".join(f"--app-scale {a}={s:g}" for a, s in scales.items())
                        + f" --reps {args.reps}")
    reserve = 25.0 if args.launch_repeat else 5.0

    todo = [a for a in apps if a in scales]
    for i, app in enumerate(todo):
        remaining = args.time_budget - (time.perf_counter() - t0) - reserve
        budget = remaining / (len(todo) - i)
        log(f"{app}: scale {scales[app]:g}, {budget:.0f} s budget")
        try:
            doc["apps"][app] = bench_app(app, args, work, scales[app], budget, doc, driver_version)
            r = doc["apps"][app]
            log(f"  {app}: native {r['modes'].get('native', {}).get('median')} s; speedups {r['speedup']}; "
                f"{len(r['checksum_mismatches'])} checksum mismatches, {len(r['failures'])} failed runs")
        except Exception as exc:
            doc["apps"][app] = {"error": f"{type(exc).__name__}: {exc}", "scale": scales[app]}
            log(f"  {app}: FAILED: {exc}")
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
        write(doc, out, base)

    if args.launch_repeat:
        # bench/shim_bench.py's microbenchmark, on the launch_overhead apps that bench/corpora/apps/build.py
        # builds beside the workloads (samples/build/ as a fallback)
        where = next((d for d in (APPS_DIR, SAMPLES_BUILD)
                      if (d / "launch_overhead").exists() and (d / "launch_overhead_dynamic").exists()), None)
        if where is None:
            doc["launch_overhead"] = {"skipped": "launch_overhead not built (run python -m bench.corpora.apps.build)"}
        else:
            try:
                from bench import shim_bench

                shim_bench.SAMPLES = where
                doc["launch_overhead"] = shim_bench.launch_overhead(work, args.launch_repeat, args.launches)
                doc["launch_overhead_binaries"] = str(where.relative_to(ROOT))
            except BaseException as exc:  # shim_bench exits on a failed run
                doc["launch_overhead"] = {"error": f"{type(exc).__name__}: {exc}"}
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
        write(doc, out, base)

    doc["partial"] = False
    doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
    j, m = write(doc, out, base)
    print(markdown(doc))
    mismatches = sum(len(r.get("checksum_mismatches", [])) for r in doc["apps"].values())
    failed = [a for a, r in doc["apps"].items() if "error" in r]
    log(f"wrote {j} and {m} in {doc['elapsed_s']} s; {mismatches} checksum mismatches; failed apps: {failed or 'none'}")
    return 1 if mismatches or failed else 0


if __name__ == "__main__":
    sys.exit(main())
