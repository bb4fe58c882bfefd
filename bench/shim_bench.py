"""The shim on the GPU, as ratios against the native run in the same machine session.

    python -m bench.shim_bench [--repeat 5] [--launches 100000]

1. Hit-path launch overhead: launch_overhead (static cudart) and launch_overhead_dynamic
   run 100,000 launches of a tiny kernel; ns per launch native, under the shim with
   PROTEUS_DISABLE=1, and under the shim with a warm cache (every launch a table hit).
   Target: <= 0.5 us per launch over native.
2. End to end for each sample: wall time of the whole process, native, shim disabled
   (pure pass-through), shim with an empty cache (cold), shim with the cache of the
   previous run (warm). Median of --repeat runs; speedup = native / mode.
3. PTX -> loadable code, per compiler: nvJitLink, ptxas, or the driver's JIT (PTX handed to
   cuModuleLoadData), for the loop_count kernels.
Writes bench/results/shim-<date>-<gpu>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.paths import RESULTS, ROOT, SAMPLES_BUILD

SAMPLES = SAMPLES_BUILD
E2E_APPS = ["loop_count", "loop_count_dynamic", "device_globals", "multi_kernel", "two_tu", "two_tu_rdc", "templates",
            "annotated", "driver_api"]


def record(app: str, work: Path) -> Path:
    out = work / "stores" / app
    proc = subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", str(SAMPLES / app), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return out


def run(app: str, env: dict | None = None, args: tuple = ()) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([str(SAMPLES / app), *args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{app} failed: {proc.stderr}")
    return dt, proc.stdout


def checksums(out: str) -> dict:
    return {p[1]: p[2] for p in (l.split() for l in out.splitlines()) if len(p) == 3 and p[0] == "checksum"}


def stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "runs": [round(x, 4) for x in xs]}


def launch_overhead(work: Path, repeat: int, launches: int) -> dict:
    """Host time per launch call. Modes alternate within each repetition, so that the machine's
    slow and fast phases (this host shows both) fall on every mode alike; the minimum over the
    repetitions is the cost without interference, the median what a run typically sees."""
    out = {}
    for app in ("launch_overhead", "launch_overhead_dynamic"):
        store = record(app, work)
        cache = work / "cache" / app
        report = work / f"{app}-report.json"
        shim = {"LD_PRELOAD": str(store / "libproteus.so"), "PROTEUS_CACHE_DIR": str(cache)}
        modes = {"native": {}, "shim_disabled": {**shim, "PROTEUS_DISABLE": "1"}, "shim_warm": shim}
        run(app, {**shim, "PROTEUS_REPORT": str(report)}, (str(launches),))  # fill the cache; check it is used
        doc = json.loads(report.read_text())
        ns = {m: [] for m in modes}
        for _ in range(repeat):
            for mode, env in modes.items():
                ns[mode].append(float(re.search(r"ns_per_launch ([\d.]+)", run(app, env, (str(launches),))[1]).group(1)))
        res = {m: stats(v) for m, v in ns.items()}
        for m in ("shim_disabled", "shim_warm"):
            res[f"overhead_ns_median_{m}"] = round(res[m]["median"] - res["native"]["median"], 1)
            res[f"overhead_ns_min_{m}"] = round(res[m]["min"] - res["native"]["min"], 1)
        res["report_of_the_filling_run"] = [{k: v for k, v in kk.items() if k in ("name", "launches", "specialized_launches",
                                             "table_hits", "fallback_launches", "launch_errors")} for kk in doc["kernels"]]
        out[app] = res
    return out


def end_to_end(work: Path, repeat: int) -> dict:
    out = {}
    for app in E2E_APPS:
        store = record(app, work)
        cache = work / "cache" / f"e2e-{app}"
        shim = {"LD_PRELOAD": str(store / "libproteus.so"), "PROTEUS_CACHE_DIR": str(cache)}
        _, ref = run(app)
        res = {m: [] for m in ("native", "shim_disabled", "cold", "warm")}
        same = True
        for _ in range(repeat):  # interleaved, so drifts of the machine hit every mode alike
            for mode in res:
                if mode == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                env = {} if mode == "native" else ({**shim, "PROTEUS_DISABLE": "1"} if mode == "shim_disabled" else shim)
                dt, stdout = run(app, env)
                same &= checksums(stdout) == checksums(ref)
                res[mode].append(dt)
        entry = {m: stats(v) for m, v in res.items()}
        for m in ("shim_disabled", "cold", "warm"):
            entry[f"speedup_{m}"] = round(entry["native"]["median"] / entry[m]["median"], 3)
        entry["checksums_identical"] = same
        out[app] = entry
    return out


def ptx_compilers(repeat: int) -> dict:
    """Time from PTX to a loaded CUfunction for each compiler (the driver JIT included)."""
    from cuda.bindings import driver as cu

    from proteus_rewrite.fatbin import extract
    from proteus_rewrite.jit import Config, Launch, specialize
    from proteus_rewrite.jit.launch import parse_value

    cu.cuInit(0)
    _, dev = cu.cuDeviceGet(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    t = extract(SAMPLES / "loop_count")
    res = {}
    for compiler in ("nvjitlink", "ptxas", "driver"):
        cfg = Config.from_env({"PROTEUS_PTX_COMPILER": compiler})
        per_kernel = {}
        for k in t.kernels:
            samples = []
            for i in range(repeat + 1):
                raw = tuple(parse_value(p, "1" if p.llvm_type == "i1" else str(8 + i)) if p.kind in ("int", "float") else bytes(p.size)
                            for p in k.params)
                t0 = time.perf_counter()
                r = specialize(t, k, Launch(raw, (64, 1, 1), (256, 1, 1), 90), cfg)
                err, mod = cu.cuModuleLoadData(r.image.data)
                assert err == cu.CUresult.CUDA_SUCCESS, err
                err, fn = cu.cuModuleGetFunction(mod, k.name.encode())
                dt = (time.perf_counter() - t0) * 1000
                cu.cuModuleUnload(mod)
                if i:  # the first one loads libraries
                    samples.append(dt)
            per_kernel[k.demangled] = round(statistics.median(samples), 2)
        res[compiler] = {"median_ms_specialize_and_load": per_kernel,
                         "overall_median_ms": round(statistics.median(per_kernel.values()), 2)}
    return res


def environment() -> dict:
    import llvmlite

    from proteus_rewrite import __version__, gpu

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return {"gpu": gpu.status().reason, "nvidia_smi": smi.stdout.strip(), "cuda": nvcc[-1] if nvcc else None,
            "llvm": "22 (llvmlite %s)" % llvmlite.__version__, "tool": __version__, "python": sys.version.split()[0]}


def markdown(doc: dict) -> str:
    lines = [f"# Shim benchmark, {doc['date']}", "", f"GPU: {doc['environment']['gpu']}; {doc['environment']['cuda']}", "",
             f"Command: `{doc['command']}`", "", "## Launch overhead (host ns per launch call; median, and min, of runs)", "",
             "| app | native | shim, disabled | shim, warm cache | overhead warm (median / min) | overhead disabled (median / min) |",
             "|---|---:|---:|---:|---:|---:|"]
    for app, r in doc["launch_overhead"].items():
        lines.append(f"| {app} | {r['native']['median']} / {r['native']['min']} | {r['shim_disabled']['median']} / "
                     f"{r['shim_disabled']['min']} | {r['shim_warm']['median']} / {r['shim_warm']['min']} | "
                     f"{r['overhead_ns_median_shim_warm']} / {r['overhead_ns_min_shim_warm']} | "
                     f"{r['overhead_ns_median_shim_disabled']} / {r['overhead_ns_min_shim_disabled']} |")
    lines += ["", "## End to end (seconds, median; speedup = native / mode)", "",
              "| app | native s | disabled | cold | warm | identical output |", "|---|---:|---:|---:|---:|---|"]
    for app, r in doc["end_to_end"].items():
        lines.append(f"| {app} | {r['native']['median']} | {r['speedup_shim_disabled']}x | {r['speedup_cold']}x | "
                     f"{r['speedup_warm']}x | {r['checksums_identical']} |")
    lines += ["", "## PTX to loaded kernel (ms, median per loop_count kernel)", "", "| compiler | median ms |", "|---|---:|"]
    for c, r in doc["ptx_compilers"].items():
        lines.append(f"| {c} | {r['overall_median_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--launch-repeat", type=int, default=15)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--tag", default="h100")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="proteus-bench-"))
    doc = {"benchmark": "libproteus.so on the GPU", "command": "python -m bench.shim_bench " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "environment": environment(), "repeat": args.repeat}
    doc["launch_overhead"] = launch_overhead(work, args.launch_repeat, args.launches)
    doc["end_to_end"] = end_to_end(work, args.repeat)
    doc["ptx_compilers"] = ptx_compilers(args.repeat)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"shim-{doc['date']}-{args.tag}"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    base.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {base}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
