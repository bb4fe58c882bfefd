#!/usr/bin/env python3
"""The benchmark suite on the GPU: native vs JIT (off, cold, warm) per workload and per kernel.

    python3 bench/run.py [--reps 5] [--apps adam,wsm5] [--scale 1] [--out bench/results] [--time-budget 520]

For each workload of bench/apps/build/ (built elsewhere by bench/apps/build.py):
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
the hit-path launch overhead (bench/shim_bench.py's launch_overhead, on bench/apps/build/launch_overhead);
GPU, driver, CUDA, LLVM and tool versions.
Writes <out>/<date>-<gpu>.json (after every workload, so a run cut short leaves its results)
and <out>/<date>-<gpu>.md; bench/plot.py draws the chart from the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

APPS_DIR = ROOT / "bench" / "apps" / "build"
ALL_APPS = ["adam", "rsbench", "wsm5", "feynman_kac", "lulesh", "sw4ck"]
MODES = ["native", "disabled", "off", "cold", "warm"]
# The Proteus paper's V100 end-to-end speedups (Proteus with a warm cache vs AOT, CGO'25 Table 2).
PAPER_WARM = {"adam": 1.36, "rsbench": 1.33, "wsm5": 1.77, "feynman_kac": 1.12, "lulesh": 1.00, "sw4ck": 0.99}
OFF_ENV = {"PROTEUS_SPECIALIZE_ARGS": "0", "PROTEUS_SPECIALIZE_LAUNCH_BOUNDS": "0", "PROTEUS_SPECIALIZE_DIMS": "0"}
STAGES = ("plan", "ir", "optimize", "ptx", "cubin", "total")


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
# environment


def _cmd(args: list[str]) -> str | None:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=30)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit(short: bool = False) -> str | None:
    """GIT_COMMIT: set by whoever sends the tree to a machine whose copy of .git may be stale."""
    return os.environ.get("GIT_COMMIT") or _cmd(["git", "-C", str(ROOT), "rev-parse", *(["--short"] if short else []), "HEAD"])


def cpu_results(benchmark: str, script: str, argv: list[str] | None, **fields) -> dict:
    """The header of a CPU benchmark's results file: what ran, where and when."""
    return {"benchmark": benchmark, "date": datetime.date.today().isoformat(),
            "command": f"python3 bench/{script} " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": git_commit(short=True), "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            **fields}


def write_cpu_results(doc: dict, out: str, prefix: str, tag: str) -> Path:
    """OUT/PREFIX-DATE-HOST[-TAG].json"""
    path = Path(out) / f"{prefix}-{doc['date']}-{platform.node() or 'host'}{'-' + tag if tag else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def cpu_arguments(ap) -> None:
    """--out and --tag, as every CPU benchmark takes them (write_cpu_results)."""
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--tag", default="", help="appended to the results' file name")


def publish_cpu_results(doc: dict, args, prefix: str, script: str, columns: list[str], rows: list[list]) -> Path:
    """Write a CPU benchmark's results (write_cpu_results), print them as a markdown table
    (the first column left-aligned) and say where they went."""
    path = write_cpu_results(doc, args.out, prefix, args.tag)
    print("| " + " | ".join(columns) + " |\n|---|" + "---:|" * (len(columns) - 1))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print(f"{script}: wrote {path}", file=sys.stderr)
    return path


def environment() -> dict:
    env: dict = {"python": sys.version.split()[0], "host": platform.node(), "kernel": platform.release()}
    try:
        env["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except Exception:
        env["cpu"] = None
    env["cpu_count"] = os.cpu_count()
    smi = _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,"
                "pci.bus_id,persistence_mode", "--format=csv,noheader"])
    env["nvidia_smi"] = smi
    env["gpu"] = smi.split(",")[0].strip() if smi else None
    env["driver"] = smi.split(",")[1].strip() if smi else None
    try:
        from cuda.bindings import driver as cu

        err, version = cu.cuDriverGetVersion()
        env["cuda_driver_api"] = f"{int(version) // 1000}.{int(version) % 1000 // 10}" if int(err) == 0 else None
        env["cuda_driver_api_int"] = int(version)
    except Exception as exc:
        env["cuda_driver_api"] = f"unavailable ({type(exc).__name__}: {exc})"
    nvcc = None
    for candidate in ("nvcc", os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", "nvcc")):
        nvcc = _cmd([candidate, "--version"])
        if nvcc:
            break
    env["cuda_toolkit"] = nvcc.splitlines()[-1] if nvcc else None
    try:
        import llvmlite
        import llvmlite.binding as llvm

        env["llvm"] = ".".join(map(str, llvm.llvm_version_info))
        env["llvmlite"] = llvmlite.__version__
    except Exception as exc:
        env["llvm"] = f"unavailable ({exc})"
    try:
        from proteus_rewrite import __version__

        env["proteus_rewrite"] = __version__
    except Exception:
        env["proteus_rewrite"] = None
    env["git_commit"] = git_commit()
    env["git_dirty"] = bool(_cmd(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]))
    clang = _cmd([os.environ.get("CLANG", "clang++-19"), "--version"])
    env["clang_here"] = clang.splitlines()[0] if clang else None
    comment = _cmd(["readelf", "-p", ".comment", str(APPS_DIR / "adam")])
    env["apps_built_by"] = sorted({m.group(1).strip() for m in re.finditer(r"\]\s+(.*clang.*)", comment or "")}) or None
    return env


def gpu_tag(env: dict) -> str:
    name = (env.get("gpu") or "nogpu").lower()
    m = re.search(r"\b([a-z]+\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


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


# ---------------------------------------------------------------------------------------------
# output


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
              "| workload | kernel | launches | native ms | off ms | warm ms | warm kernel speedup | cold compile ms | plan / ir / optimize / ptx / cubin ms |",
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every mode (default 5)")
    ap.add_argument("--apps", default=",".join(ALL_APPS), help=f"comma-separated (default: {','.join(ALL_APPS)})")
    ap.add_argument("--scale", type=float, default=1.0, help="work multiplier for every app (default 1)")
    ap.add_argument("--app-scale", action="append", default=[], metavar="APP=F",
                    help="pin one app's scale (no calibration for it); repeatable")
    ap.add_argument("--calibrate", type=float, default=1.2, metavar="SECONDS",
                    help="scale each app so its kernels take this long natively (default 1.2; 0: off)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results directory (default bench/results)")
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
           "command": "python3 bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
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
            doc["apps"][app] = {"error": f"{APPS_DIR / app} not found (run bench/apps/build.py)"}
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
    doc["reproduce"] = ("python3 bench/run.py --calibrate 0 " + " ".join(f"--app-scale {a}={s:g}" for a, s in scales.items())
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
        # bench/shim_bench.py's microbenchmark, on the launch_overhead apps that bench/apps/build.py
        # builds beside the workloads (samples/build/ as a fallback)
        where = next((d for d in (APPS_DIR, ROOT / "samples" / "build")
                      if (d / "launch_overhead").exists() and (d / "launch_overhead_dynamic").exists()), None)
        if where is None:
            doc["launch_overhead"] = {"skipped": "launch_overhead not built (run bench/apps/build.py)"}
        else:
            try:
                sys.path.insert(0, str(ROOT / "bench"))
                import shim_bench

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
