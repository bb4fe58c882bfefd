"""proteus-rewrite beside upstream Proteus on the Proteus paper's six HeCBench programs, in one
run on one GPU: each program's plain build (no bitcode flag), the same program built with the
recommended recipe and run under proteus-rewrite, and Proteus's annotated build
(../shared/tools/proteus-upstream bundle). Rounds of runs, one of each build per round in a rotated
order: cold (plain, ours and Proteus, each JIT from an emptied cache), then warm (plain,
native, ours, Proteus). `--phase cold` and `--phase warm` split a program too long for one device
call (sw4ck: about 30 s a run) into two calls, each with its own plain runs; --render joins them.

Kernel figures are the programs' own printed ones; end to end is the process's wall time.
Ours must print what the same binary prints natively (run once, the reference for ours); Proteus
and that native run are compared with the plain build (timing lines masked). One extra warm
run of ours is traced with CUPTI (--kernel-trace-lib) to count the launches that ran a variant,
from the driver's records. --extra PROG=BUILD runs another build of a program (hec/PROG/BUILD)
natively and under the tool, cold with PROTEUS_ASYNC_COMPILATION=0 and warm, for output identity
only. --nvcc adds each program's nvcc build (hec/PROG/main_nvcc, as HeCBench's Makefile builds it):
natively ("nvcc AOT") and rewritten by the tool (the PTX route, its own cache), cold and warm in
the same rounds, ours on it held to its native output, a table of its own in the report (ours on
nvcc against nvcc AOT and against Proteus warm) and a CUPTI-traced warm run of its own.
--ptx-route rewrites main_all a second time with PROTEUS_CODE_KIND=ptx (the tool records its
kernels from the PTX the binary carries, not its bitcode: the PTX route on the clang build) and
runs it like ours, cold from its own emptied cache and warm, in the same rounds: held to the
native run of main_all, as ours is, against ours (the bitcode route on the same binary) and
Proteus warm in a table of its own, cold end to end paired by round with ours', and a
CUPTI-traced warm run of its own.
Standard library only: it runs on the GPU host.

    python -m bench.proteus_compare --hec DIR --proteus DIR --tool .venv/bin/proteus-rewrite --out OUT
    python -m bench.proteus_compare --render OUT A.json B.json   # one report from several calls
    python -m bench.proteus_compare ... --phase cold --cache-dir /tmp/c   # then --phase warm, same cache
    python -m bench.proteus_compare ... --nvcc   # and the nvcc builds: natively, and under the tool
    python -m bench.proteus_compare ... --ptx-route   # and main_all on the PTX route, beside the bitcode route
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.lib import cupti  # the CUPTI library's trace format, read in one place

# name: (arguments, [(metric, regex of its value, "lower" or "higher" is better)], input files)
# The arguments are upstream run.sh's (runs.txt), but feynman-kac's: 1, not 10 (about 12 s).
PROGRAMS = {
    "rsbench": (["-s", "large", "-m", "event"],
                [("kernel lookups/s", r"Simulation Kernel Only Statistics\s*\nLookups/s:\s+([\d,]+)", "higher")], []),
    "wsm5": (["10"], [("avg kernel ms", r"Average kernel execution time: ([\d.]+) \(ms\)", "lower")], []),
    "sw4ck": (["sw4ck.in", "100"],
              [("avg kernels ms", r"(?s)Average execution time of sw4ck kernels:.*Average execution time of sw4ck kernels: ([\d.]+)",
                "lower")], ["sw4ck.in"]),
    "adam": (["10000", "200", "100"], [("avg kernel ms", r"Average kernel execution time ([\d.]+) \(ms\)", "lower")], []),
    "lulesh": (["-i", "100", "-s", "128", "-r", "11", "-b", "1", "-c", "1"],
               [("FOM z/s", r"FOM\s+=\s+([\d.]+)", "higher"), ("elapsed s", r"Elapsed time\s+=\s+([\d.]+)", "lower")], []),
    "feynman-kac": (["1"], [("avg kernel s", r"Average kernel time: ([\d.]+) \(s\)", "lower")], []),
}
# Lines that carry times or rates: their numbers are not compared.
TIMING = re.compile(r"time|Time|Lookups/s|Runtime|FOM|Grind|Elapsed|seconds|took|Running on", re.I)
NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")


def masked(text: str) -> list[str]:
    """Output lines to compare: numbers on timing lines hidden, with the blanks that pad them
    (lulesh aligns its figures: a wider number shifts the column)."""
    return ["".join(NUMBER.sub("#", line).split()) if TIMING.search(line) else line
            for line in text.splitlines() if line.strip()]


def metrics(program: str, text: str) -> dict[str, float]:
    out = {}
    for name, pattern, _ in PROGRAMS[program][1]:
        m = re.search(pattern, text)
        if m:
            out[name] = float(m.group(1).replace(",", ""))
    return out


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> dict:
    """One run: exit code, wall time, and the host CPU time it used (user + system, its threads
    and children together: what a JIT's own threads cost beside the app's)."""
    def cpu() -> float:
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime
    c0, t0 = cpu(), time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), ""
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(cpu() - c0, 3), "stdout": out,
            "stderr_tail": err[-2000:]}


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        self.cache = Path(args.cache_dir) if args.cache_dir else self.out / "cache"
        self.doc = {"stamp": stamp(args), "programs": {}}

    def save(self) -> None:
        (self.out / "proteus-compare.json").write_text(json.dumps(self.doc, indent=1))
        (self.out / "proteus-compare.md").write_text(markdown(self.doc))

    def run_once(self, prog: str, label: str, cmd: list[str], cwd: Path, env: dict, index: int,
                 fresh: Path | None = None, make_fresh: bool = False) -> dict:
        """One run, its output kept in logs/; with `fresh`, from that cache folder emptied (a
        cold run; made again where the JIT makes only its last level: Proteus)."""
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
            if make_fresh:
                fresh.mkdir(parents=True)
        r = run(cmd, cwd, env, self.a.timeout)
        r["metrics"] = metrics(prog, r["stdout"])
        r["output"] = masked(r["stdout"])
        (self.out / "logs").mkdir(exist_ok=True)
        (self.out / "logs" / f"{prog}.{label}.{index}.txt").write_text(r.pop("stdout") + "\n--- stderr\n" + r["stderr_tail"])
        return r

    def over_budget(self) -> bool:   # past the budget: fewer runs, said so (n)
        return time.monotonic() > self.deadline + self.a.grace_s

    def series(self, prog: str, label: str, cmd: list[str], cwd: Path, env: dict, reps: int,
               fresh: Path | None = None, make_fresh: bool = False) -> dict:
        """`reps` runs of one command in a row (cold runs: each from `fresh` emptied)."""
        runs = []
        for i in range(reps):
            if self.over_budget():
                break
            runs.append(self.run_once(prog, label, cmd, cwd, env, i, fresh, make_fresh))
        return summarized(runs)

    def rounds(self, prog: str, res: dict, commands: list[tuple], reps: int) -> None:
        """`reps` rounds, each running every command once, in an order rotated from round to
        round. lulesh's FOM moved by 15% between series run minutes apart on the H100 host
        (plain 39-55 k z/s over five calls); interleaved, a drift of the host falls on every
        build alike. A command is (key, label, cmd, cwd, env[, fresh, make_fresh]): with fresh,
        each of its runs starts from that cache emptied (a cold run)."""
        runs: dict[str, list] = {c[0]: [] for c in commands}
        for i in range(reps):
            if self.over_budget():
                break
            for key, label, cmd, cwd, env, *cold in commands[i % len(commands):] + commands[:i % len(commands)]:
                runs[key].append(self.run_once(prog, label, cmd, cwd, env, i, *cold))
        for key, got in runs.items():
            res[key] = summarized(got)

    def program(self, prog: str) -> None:
        args, _, inputs = PROGRAMS[prog]
        reps = self.a.reps_for.get(prog, self.a.reps)
        cold_reps = self.a.cold_reps_for.get(prog, self.a.cold_reps or reps)
        hec, up, phase = Path(self.a.hec) / prog, Path(self.a.proteus), self.a.phase
        res = self.doc["programs"].setdefault(prog, {"phase": phase})
        plain = ("plain", "plain", [str(hec / "main_plain"), *args], hec, {})
        # the bitcode-carrying build natively: the output ours must print (judge()), and the
        # speed of the binary the tool is given (the ratio "ours / native")
        native = ("native", "native", [str(hec / "main_all"), *args], hec, {})
        warm, cold = [plain, native], [("plain_cold", "plain-cold", *plain[2:])]
        # ours: the recommended build, rewritten (the rewritten executable loads the shim itself)
        rec = self.out / "rewritten" / prog
        p = subprocess.run([self.a.tool, str(hec / "main_all"), "-o", str(rec)], capture_output=True, text=True)
        res["rewrite_rc"] = p.returncode
        ours = None
        if p.returncode == 0:
            for f in inputs:
                shutil.copy(hec / f, rec / f)
            cache = self.cache / "ours" / prog
            env = {"PROTEUS_CACHE_DIR": str(cache)}
            ours = ([str(rec / "main_all"), *args], rec, env)
            cold.append(("ours_cold", "ours-cold", ours[0], rec, {**env, "PROTEUS_REPORT": str(self.out / f"{prog}.cold.json")},
                         cache))
            warm.append(("ours_warm", "ours-warm", *ours))
        # Proteus: its annotated build, its cache in a fresh directory (it makes the last level only)
        pcache = self.cache / "proteus" / prog
        penv = {"LD_LIBRARY_PATH": f"{up / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}", "PROTEUS_CACHE_DIR": str(pcache)}
        pexe = [str(up / "bin" / f"{prog}.exe"), *args]
        cold.append(("proteus_cold", "proteus-cold", pexe, up / "src" / prog, penv, pcache, True))
        warm.append(("proteus_warm", "proteus-warm", pexe, up / "src" / prog, penv))
        ours_nvcc = self.nvcc(prog, res, warm, cold) if self.a.nvcc else None
        ours_ptx = self.ptx_route(prog, res, warm, cold) if self.a.ptx_route else None
        # cold first, each beside a plain run; the last cold run of each JIT leaves its cache
        # to the warm rounds
        if phase != "warm":
            if phase == "cold":   # the warm rounds run natively in another call: once here, ours' reference
                res["native"] = self.series(prog, "native", native[2], hec, {}, 1)
            self.rounds(prog, res, cold, cold_reps)
            if ours is not None:
                res["speed_trials"] = speed_trials(self.out / f"{prog}.cold.json")
            if ours_nvcc is not None:
                res["speed_trials_nvcc"] = speed_trials(self.out / f"{prog}.nvcc.cold.json")
            if ours_ptx is not None:
                res["speed_trials_ptx"] = speed_trials(self.out / f"{prog}.ptx.cold.json")
            self.save()
        if phase == "cold":
            judge(res)
            nvcc_ratios(prog, res)
            ptx_ratios(prog, res)
            return
        if phase == "warm":   # a cache the cold call left on this machine, or one run to fill it
            for key, label, cmd, cwd, env, fresh, *make in (c for c in cold if len(c) > 5):
                if not (fresh.is_dir() and any(fresh.iterdir())):
                    r = self.run_once(prog, label.replace("cold", "fill"), cmd, cwd, env, 0, fresh, *make)
                    res[key.replace("cold", "fill")] = {"rc": r["rc"], "wall_s": r["wall_s"]}
        self.rounds(prog, res, warm, reps)
        self.save()
        if self.a.kernel_trace_lib and self.a.gpu_time_rounds:
            self.gpu_time(prog, res, warm)
            self.save()
        if ours is not None and self.a.alt:   # another setting of ours (--alt): its own cache, filled first
            exe, cwd, env = ours
            alt = {"PROTEUS_CACHE_DIR": env["PROTEUS_CACHE_DIR"] + "-alt", **alt_env(self.a.alt)}
            self.series(prog, "ours-alt-cold", exe, cwd, alt, 1, fresh=Path(alt["PROTEUS_CACHE_DIR"]))
            res["ours_alt_warm"] = self.series(prog, "ours-alt-warm", exe, cwd, alt, reps)
            res["alt"] = self.a.alt
        if self.a.kernel_trace_lib:
            # the evidence that variants ran: not left out for the time budget
            for build, suffix, key in ((ours, "", "ours"), (ours_nvcc, ".nvcc", "ours_nvcc"), (ours_ptx, ".ptx", "ours_ptx")):
                if build is None:
                    continue
                exe, cwd, env = build
                trace = self.out / f"{prog}{suffix}.kernels.txt"
                res[f"{key}_traced"] = summarized([self.run_once(prog, f"{key.replace('_', '-')}-traced", exe, cwd, {
                    **env, "CUDA_INJECTION64_PATH": self.a.kernel_trace_lib, "CUPTI_KERNEL_TRACE_FILE": str(trace),
                    "PROTEUS_REPORT": str(self.out / f"{prog}{suffix}.warm.json")}, 0)])
                names = cupti.kernels_run(trace) if trace.exists() else []
                res["cupti" + suffix.replace(".", "_")] = {
                    "launches": len(names), "variant_launches": sum("$proteus$" in n for n in names),
                    "variant_kernels": sorted({n for n in names if "$proteus$" in n})[:20]}
        judge(res)
        nvcc_ratios(prog, res)
        ptx_ratios(prog, res)
        self.save()

    def nvcc(self, prog: str, res: dict, warm: list, cold: list) -> tuple | None:
        """--nvcc: the program's nvcc build (hec/PROG/main_nvcc, built as HeCBench's Makefile
        builds it: SASS and PTX, no bitcode) natively ("nvcc AOT"), and the same binary rewritten
        and run under the tool (the PTX route), cold from its own emptied cache and warm. Adds
        their commands to the rounds; returns ours-on-nvcc's (cmd, cwd, env), or None."""
        args, _, inputs = PROGRAMS[prog]
        hec = Path(self.a.hec) / prog
        exe = hec / "main_nvcc"
        if not exe.is_file():
            res["nvcc_error"] = f"{exe}: no such file"
            return None
        nvcc = ("nvcc", "nvcc", [str(exe), *args], hec, {})
        warm.append(nvcc)
        cold.append(("nvcc_cold", "nvcc-cold", *nvcc[2:]))   # the AOT run beside ours' cold one
        rec = self.out / "rewritten" / f"{prog}-nvcc"
        p = subprocess.run([self.a.tool, str(exe), "-o", str(rec)], capture_output=True, text=True)
        res["rewrite_nvcc_rc"] = p.returncode
        if p.returncode != 0:
            res["nvcc_error"] = "proteus-rewrite: " + (p.stderr.strip()[-300:] or f"exit {p.returncode}")
            return None
        for f in inputs:
            shutil.copy(hec / f, rec / f)
        cache = self.cache / "ours-nvcc" / prog
        env = {"PROTEUS_CACHE_DIR": str(cache)}
        cmd = [str(rec / "main_nvcc"), *args]
        cold.append(("ours_nvcc_cold", "ours-nvcc-cold", cmd, rec,
                     {**env, "PROTEUS_REPORT": str(self.out / f"{prog}.nvcc.cold.json")}, cache))
        warm.append(("ours_nvcc_warm", "ours-nvcc-warm", cmd, rec, env))
        return cmd, rec, env

    def ptx_route(self, prog: str, res: dict, warm: list, cold: list) -> tuple | None:
        """--ptx-route: the recommended build (hec/PROG/main_all) rewritten again, with
        PROTEUS_CODE_KIND=ptx for the rewrite (at record time: its kernels recorded from the PTX
        it carries rather than its bitcode), so that the two routes run on one binary. Cold from
        its own emptied cache and warm; adds their commands to the rounds; returns its
        (cmd, cwd, env), or None."""
        args, _, inputs = PROGRAMS[prog]
        hec = Path(self.a.hec) / prog
        rec = self.out / "rewritten" / f"{prog}-ptx"
        p = subprocess.run([self.a.tool, str(hec / "main_all"), "-o", str(rec)], capture_output=True, text=True,
                           env={**os.environ, "PROTEUS_CODE_KIND": "ptx"})
        res["rewrite_ptx_rc"] = p.returncode
        if p.returncode != 0:
            res["ptx_error"] = "proteus-rewrite: " + (p.stderr.strip()[-300:] or f"exit {p.returncode}")
            return None
        for f in inputs:
            shutil.copy(hec / f, rec / f)
        cache = self.cache / "ours-ptx" / prog
        # at run time too: a kernel recorded both ways would otherwise take its bitcode
        env = {"PROTEUS_CACHE_DIR": str(cache), "PROTEUS_CODE_KIND": "ptx"}
        cmd = [str(rec / "main_all"), *args]
        cold.append(("ours_ptx_cold", "ours-ptx-cold", cmd, rec,
                     {**env, "PROTEUS_REPORT": str(self.out / f"{prog}.ptx.cold.json")}, cache))
        warm.append(("ours_ptx_warm", "ours-ptx-warm", cmd, rec, env))
        return cmd, rec, env

    def gpu_time(self, prog: str, res: dict, commands: list[tuple]) -> None:
        """Rounds of the warm commands traced with CUPTI (--kernel-trace-lib): each run's kernel
        time on the GPU, the sum of its kernels' records (end - start, both the GPU's clock), in
        all and per kernel. The host does not reach it: lulesh's elapsed time moved 10-25%
        between runs of one build, most of it host work the builds share."""
        d = self.out / "gpu-time"
        d.mkdir(exist_ok=True)
        totals: dict[str, list[float]] = {c[0]: [] for c in commands}
        kernels: dict[str, dict[str, list[float]]] = {c[0]: {} for c in commands}
        for i in range(self.a.gpu_time_rounds):
            if self.over_budget():
                break
            for key, label, cmd, cwd, env in commands[i % len(commands):] + commands[:i % len(commands)]:
                trace = d / f"{prog}.{label}.{i}.txt"
                traced = {**env, "CUDA_INJECTION64_PATH": self.a.kernel_trace_lib, "CUPTI_KERNEL_TRACE_FILE": str(trace),
                          "CUPTI_KERNEL_TRACE_TIMES": "1"}
                r = self.run_once(prog, f"{label}-gpu", cmd, cwd, traced, i)
                try:
                    records = cupti.kernel_times(trace) if r["rc"] == 0 else []
                except (OSError, RuntimeError):   # no trace, or not a timed one: the run counts for nothing
                    records = []
                if not records:
                    continue
                totals[key].append(sum(ns for _, ns in records) / 1e6)
                run: dict[str, float] = {}
                for name, ns in records:   # a variant by its kernel's name (ours: name$proteus$..., Proteus: name$...)
                    base = name.split("$", 1)[0]
                    run[base] = run.get(base, 0.0) + ns / 1e6
                for base, ms in run.items():
                    kernels[key].setdefault(base, []).append(ms)
        res["gpu_ms"] = {k: summary(v) for k, v in totals.items() if v}
        res["gpu_kernel_ms"] = {k: {n: statistics.median(v) for n, v in per.items()} for k, per in kernels.items() if per}

    def extra(self, prog: str, build: str) -> None:
        """Another build of `prog`, for output identity only: natively, then under the tool cold
        with every launch waiting for its variant, then warm."""
        args, _, inputs = PROGRAMS[prog]
        hec = Path(self.a.hec) / prog
        res = self.doc.setdefault("extra", {}).setdefault(f"{prog}/{build}", {})
        res["native"] = self.series(prog, f"{build}-native", [str(hec / build), *args], hec, {}, 1)
        rec = self.out / "rewritten" / f"{prog}-{build}"
        p = subprocess.run([self.a.tool, str(hec / build), "-o", str(rec)], capture_output=True, text=True)
        res["rewrite_rc"] = p.returncode
        if p.returncode != 0:
            res["error"] = p.stderr.strip()[-300:]
            return
        for f in inputs:
            shutil.copy(hec / f, rec / f)
        env = {"PROTEUS_CACHE_DIR": str(self.out / "cache" / "ours" / f"{prog}-{build}")}
        res["ours_sync"] = self.series(prog, f"{build}-ours-sync", [str(rec / build), *args], rec,
                                       {**env, "PROTEUS_ASYNC_COMPILATION": "0"}, 1)
        res["ours_warm"] = self.series(prog, f"{build}-ours-warm", [str(rec / build), *args], rec, env, 1)
        judge(res)

    def main(self) -> int:
        for prog in self.a.programs:
            if time.monotonic() > self.deadline:
                self.doc.setdefault("skipped_for_time", []).append(prog)
                continue
            print(f"proteus_compare: {prog}", flush=True)
            try:
                self.program(prog)
            except Exception as exc:  # one program's failure is a result, not the end of the run
                self.doc["programs"].setdefault(prog, {})["error"] = f"{type(exc).__name__}: {exc}"
            self.save()
        for spec in self.a.extra:
            prog, build = spec.split("=", 1)
            print(f"proteus_compare: {prog} ({build})", flush=True)
            try:
                self.extra(prog, build)
            except Exception as exc:
                self.doc.setdefault("extra", {}).setdefault(spec, {})["error"] = f"{type(exc).__name__}: {exc}"
            self.save()
        return 0


def summarized(runs: list[dict]) -> dict:
    keys = {k for r in runs for k in r["metrics"]}
    return {"runs": runs, "wall_s": summary([r["wall_s"] for r in runs if r["rc"] == 0]),
            "cpu_s": summary([r["cpu_s"] for r in runs if r["rc"] == 0 and "cpu_s" in r]),
            "metrics": {k: summary([r["metrics"][k] for r in runs if k in r["metrics"]]) for k in sorted(keys)}}


def paired(res: dict, base: str, key: str) -> dict | None:
    """Per round, `base`'s wall time over `key`'s (runs of one round are neighbours in time, so a
    drift of the host cancels): their summary, where both have a successful run in every round."""
    a, b = (res.get(k, {}).get("runs") or [] for k in (base, key))
    if not a or len(a) != len(b) or any(r["rc"] != 0 for r in a + b):
        return None
    return summary([x["wall_s"] / y["wall_s"] for x, y in zip(a, b)])


def speed_trials(report: Path) -> list[dict]:
    """Per kernel of a cold run's PROTEUS_REPORT, its variants' speed trials (PROTEUS_SPEED_CHECK):
    verdicts and the variants' GPU time over the original's."""
    try:
        kernels = json.loads(report.read_text())["kernels"]
    except (OSError, ValueError, KeyError):
        return []
    out = []
    for k in kernels:
        trials = [v["speed"] for v in k.get("variants") or [] if isinstance(v.get("speed"), dict)]
        if trials:
            out.append({"kernel": (k.get("demangled") or k["name"])[:60],
                        "verdicts": {v: sum(t["verdict"] == v for t in trials) for v in ("kept", "slower", "undecided")},
                        "time_vs_original": k.get("kernel_time_vs_original")})
    return out


def alt_env(settings: list[str]) -> dict[str, str]:
    env = {}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("PROTEUS_"):
            raise ValueError(f"--alt {item!r}: expected PROTEUS_NAME=VALUE")
        env[name] = value
    return env


def judge(res: dict) -> None:
    """Each run's output against its reference: ours against the native run of the same binary
    (the tool's promise: ours on the PTX route of main_all too; ours on the nvcc build against
    that build's AOT run), the native runs (bitcode and nvcc builds) and Proteus against the
    plain build's first run."""
    def first(key: str) -> list[str] | None:
        runs = res.get(key, {}).get("runs") or []
        return masked("\n".join(runs[0]["output"])) if runs else None
    plain, native = first("plain") or first("plain_cold"), first("native")
    nvcc = first("nvcc") or first("nvcc_cold")
    for key, series in res.items():
        if not isinstance(series, dict) or "runs" not in series:
            continue
        if key.startswith("ours_nvcc"):   # ours on the nvcc build: what that build prints natively
            ref = nvcc
        elif key.startswith("ours"):   # ours_ptx too: the PTX route of main_all prints what main_all does
            ref = native
        elif key == "native":  # an extra build has no plain run: its native run stands alone
            ref = plain if plain is not None else native
        else:
            ref = plain
        for r in series["runs"]:
            r["same_output"] = ref is not None and masked("\n".join(r["output"])) == ref
        series["all_ok"] = bool(series["runs"]) and all(r["rc"] == 0 and r["same_output"] for r in series["runs"])


def speedup(better: str, value: float, ref: float) -> float:
    """How much faster `value` is than `ref` (>1: faster), for a metric where `better` is higher or lower."""
    return value / ref if better == "higher" else ref / value


def by_round(res: dict, key: str, ref: str, name: str, better: str) -> dict | None:
    """Per warm round, `key`'s speed-up over `ref` in metric `name` (runs of one round are
    neighbours in time): their summary, over the rounds where both printed the figure."""
    a, b = (res.get(k, {}).get("runs") or [] for k in (key, ref))
    if not a or len(a) != len(b):
        return None
    pairs = [(x["metrics"].get(name), y["metrics"].get(name)) for x, y in zip(a, b)
             if x.get("rc") == 0 and y.get("rc") == 0]
    return summary([speedup(better, x, y) for x, y in pairs if x and y])


def side_ratios(prog: str, res: dict, key: str, refs: tuple[tuple[str, str], ...], cold: tuple[str, str]) -> dict:
    """`key`'s warm series against each (label, reference series), per metric: the ratio of
    medians and the per-round ratios' summary (the warm rounds interleave them); cold end to end
    paired by round, `cold` = (the reference's cold series, `key`'s)."""
    out: dict = {}
    for name, _, better in PROGRAMS[prog][1]:
        med = {k: ((res.get(k) or {}).get("metrics") or {}).get(name, {}) or {} for k in (key, *(r for _, r in refs))}
        out[name] = {label: {"ratio": speedup(better, med[key]["median"], med[ref]["median"]),
                             "by_round": by_round(res, key, ref, name, better)}
                     for label, ref in refs if med[key].get("median") and med[ref].get("median")}
    out["cold_e2e_by_round"] = paired(res, *cold)
    return out


def nvcc_ratios(prog: str, res: dict) -> dict | None:
    """--nvcc: ours on the nvcc build against that build run natively (nvcc AOT) and against
    Proteus warm; cold end to end beside the nvcc run (side_ratios)."""
    if not any(k in res for k in ("nvcc", "nvcc_cold")):
        return None
    res["nvcc_ratios"] = side_ratios(prog, res, "ours_nvcc_warm", (("ours_nvcc_vs_nvcc", "nvcc"),
                                                                   ("ours_nvcc_vs_proteus", "proteus_warm")),
                                     ("nvcc_cold", "ours_nvcc_cold"))
    return res["nvcc_ratios"]


def ptx_ratios(prog: str, res: dict) -> dict | None:
    """--ptx-route: ours on the PTX route of main_all against ours on its bitcode route and
    against Proteus warm; cold end to end beside ours' cold run, >1: the PTX route is faster
    (side_ratios)."""
    if not any(k in res for k in ("ours_ptx_cold", "ours_ptx_warm")):
        return None
    res["ptx_ratios"] = side_ratios(prog, res, "ours_ptx_warm", (("ours_ptx_vs_ours", "ours_warm"),
                                                                 ("ours_ptx_vs_proteus", "proteus_warm")),
                                    ("ours_cold", "ours_ptx_cold"))
    return res["ptx_ratios"]


def render(paths: list[str], out: Path) -> int:
    """One report from the JSON of several calls (a program's runs are always from one call),
    judged again with today's masking."""
    doc: dict = {"stamp": None, "programs": {}, "extra": {}, "calls": []}
    for path in paths:
        part = json.loads(Path(path).read_text())
        doc["stamp"] = doc["stamp"] or part["stamp"]
        # a part rendered before keeps its calls; a later part's programs replace an earlier's,
        # but a --phase part replaces only the rounds it ran (cold or warm) of a program
        joins = {p: res["phase"] for p, res in part["programs"].items()
                 if res.get("phase") in ("cold", "warm") and p in doc["programs"]}
        names = (set(part["programs"]) | set(part.get("extra", {}))) - set(joins)
        def left(call: dict, p: str) -> str | None:   # what an older call still holds of a program
            base = p.split(" (")[0]
            if base in names:
                return None
            if base not in joins:
                return p
            if p == base and call.get("phase", "both") == "both":   # what is left of its rounds, said on its line
                return f"{p} ({'cold' if joins[p] == 'warm' else 'warm'} rounds)"
            return None if joins[base] in (call.get("phase"), (p[len(base) + 2:].split() or [""])[0]) else p
        for call in doc["calls"]:
            call["programs"] = [q for q in (left(call, p) for p in call["programs"]) if q]
        doc["calls"] += part.get("calls") or [{**part["stamp"], "programs": sorted(part["programs"]) + sorted(part.get("extra", {}))}]
        for section in ("programs", "extra"):
            for name, res in part.get(section, {}).items():
                if name in joins and section == "programs":
                    old = doc["programs"][name]
                    warm_native = old.get("native") if joins[name] == "cold" and "plain" in old else None
                    res = {**old, **res, "phase": "cold+warm"}
                    if warm_native:   # the warm rounds' native series, not the cold call's one reference run
                        res["native"] = warm_native
                judge(res)
                if section == "programs":
                    nvcc_ratios(name, res)
                    ptx_ratios(name, res)
                doc[section][name] = res
        doc.setdefault("skipped_for_time", []).extend(p for p in part.get("skipped_for_time", []) if p not in doc["programs"])
    doc["skipped_for_time"] = [p for p in doc["skipped_for_time"] if p not in doc["programs"]]
    doc["calls"] = [c for c in doc["calls"] if c["programs"]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "proteus-compare.json").write_text(json.dumps(doc, indent=1))
    (out / "proteus-compare.md").write_text(markdown(doc))
    return 0


def stamp(a: argparse.Namespace) -> dict:
    def first(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unknown"
    return {"commit": a.commit or first(["git", "rev-parse", "HEAD"]),
            "gpu": first(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]),
            "reps": a.reps, "reps_for": getattr(a, "reps_for", {}), "cold_reps": getattr(a, "cold_reps", 0),
            "cold_reps_for": getattr(a, "cold_reps_for", {}), "phase": getattr(a, "phase", "both"),
            "nvcc": getattr(a, "nvcc", False), "ptx_route": getattr(a, "ptx_route", False),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "hecbench": a.hecbench_commit, "proteus_bundle": (Path(a.proteus) / "VERSIONS").read_text().strip()
            if (Path(a.proteus) / "VERSIONS").exists() else "unknown"}


def markdown(doc: dict) -> str:
    s = doc["stamp"]
    calls = doc.get("calls") or [{**s, "programs": sorted(doc["programs"]) + sorted(doc.get("extra", {}))}]
    lines = [f"# proteus-rewrite vs Proteus, paper programs ({s['date']})", "",
             f"HeCBench {s['hecbench']}; medians (min-max) of the runs each call below lists"
             + "; ratios are speed-ups over the plain build (>1 is faster). Each program's plain, native, ours "
             "and Proteus runs come from one device call"
             + (", the warm ones interleaved round by round" if s.get("reps_for") is not None else "") + ":", ""]
    lines += [f"- {c['date']}: commit {c['commit']}, {c['gpu']}, {c['reps']} runs"
              + "".join(f" ({p} {n})" for p, n in (c.get("reps_for") or {}).items() if p in c["programs"])
              + (f", {c['cold_reps']} cold" if c.get("cold_reps") else "")
              + "".join(f" ({p} {n} cold)" for p, n in (c.get("cold_reps_for") or {}).items() if p in c["programs"])
              + f": {', '.join(c['programs'])}" + (f" ({c['phase']} rounds only)" if c.get("phase", "both") != "both" else "")
              for c in calls]
    lines += ["",
             "| program | metric | plain | native (bitcode build) | ours warm | Proteus warm | ours / plain | Proteus / plain "
             "| ours / native | ours cold e2e s (plain / ours) | Proteus cold e2e s (plain / Proteus) | native = plain "
             "| ours = native | Proteus = plain | variant launches (CUPTI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for prog, r in doc["programs"].items():
        if "plain" not in r:
            said = r.get("error") or ("cold rounds only (the warm ones in another call)" if r.get("phase") == "cold" else "not run")
            lines.append(f"| {prog} | {said} |" + " |" * 13)
            continue
        for name, _, better in PROGRAMS[prog][1]:
            cells = []
            base = (r["plain"]["metrics"].get(name) or {}).get("median")
            for key in ("plain", "native", "ours_warm", "proteus_warm"):
                m = (r.get(key, {}).get("metrics", {}) or {}).get(name)
                cells.append(f"{m['median']:.4g} ({m['min']:.4g}-{m['max']:.4g})" if m else "-")
            ratios = []
            for key, ref in (("ours_warm", base), ("proteus_warm", base),
                             ("ours_warm", ((r.get("native", {}).get("metrics") or {}).get(name) or {}).get("median"))):
                m = (r.get(key, {}).get("metrics", {}) or {}).get(name)
                if m and ref:
                    ratios.append(f"{(m['median'] / ref if better == 'higher' else ref / m['median']):.2f}x")
                else:
                    ratios.append("-")
            # end to end against the plain runs beside the cold ones (older files: the warm ones)
            pw = (r.get("plain_cold") or r["plain"]).get("wall_s") or {}
            cold = [f"{r[k]['wall_s']['median']:.2f}" + (f" ({pw['median'] / r[k]['wall_s']['median']:.2f}x)" if pw else "")
                    if r.get(k, {}).get("wall_s") else "-" for k in ("ours_cold", "proteus_cold")]
            def same(*keys: str) -> str:   # the series this call ran (a --phase call runs half of them)
                ran = [k for k in keys if r.get(k, {}).get("runs")]
                return "yes" if ran and all(r[k].get("all_ok", False) for k in ran) else "NO"
            ok = [same("plain", "native"), same("ours_cold", "ours_warm", "ours_traced"), same("proteus_cold", "proteus_warm")]
            c = r.get("cupti")
            traced = f"{c['variant_launches']}/{c['launches']}" if c else "-"
            lines.append(f"| {prog} | {name} | {' | '.join(cells)} | {' | '.join(ratios)} | {' | '.join(cold)} | "
                         f"{' | '.join(ok)} | {traced} |")
    lines += nvcc_table(doc)
    lines += ptx_table(doc)
    lines += ["", "End to end, warm (wall s, median): "
              + "; ".join(f"{p}: plain {r['plain']['wall_s']['median']:.2f}, ours {r['ours_warm']['wall_s']['median']:.2f}, "
                          f"Proteus {r['proteus_warm']['wall_s']['median']:.2f}"
                          + "".join(f", {label} {r[k]['wall_s']['median']:.2f}" for k, label in (*NVCC_LABELS, *PTX_LABELS)
                                    if (r.get(k) or {}).get("wall_s"))
                          for p, r in doc["programs"].items()
                          if all(r.get(k, {}).get("wall_s") for k in ("plain", "ours_warm", "proteus_warm")))]
    cpu = [f"{p}: " + ", ".join(f"{label} {r[k]['cpu_s']['median']:.2f}" for k, label in
                                (("plain", "plain"), ("native", "native"), ("ours_warm", "ours"), ("proteus_warm", "Proteus"),
                                 *NVCC_LABELS, *PTX_LABELS)
                                if (r.get(k) or {}).get("cpu_s"))
           for p, r in doc["programs"].items() if (r.get("plain") or {}).get("cpu_s")]
    if cpu:
        lines += ["", "Host CPU, warm (user + system s of the process and its children, median): " + "; ".join(cpu)]
    for p, r in doc["programs"].items():
        for name, _, better in PROGRAMS[p][1]:
            m, base = (r.get("ours_alt_warm", {}).get("metrics") or {}).get(name), (r.get("plain", {}).get("metrics") or {}).get(name)
            if m and base:
                ratio = m["median"] / base["median"] if better == "higher" else base["median"] / m["median"]
                lines.append(f"\n{p} {name}, ours warm with {' '.join(r.get('alt', []))}: "
                             f"{m['median']:.4g} ({m['min']:.4g}-{m['max']:.4g}), {ratio:.2f}x plain"
                             + ("" if r["ours_alt_warm"].get("all_ok") else " (output differs from native)"))
    for p, r in doc["programs"].items():
        parts = [f"{label} {d['median']:.3f}x ({d['min']:.3f}-{d['max']:.3f}, {d['n']} rounds)"
                 for key, label in (("ours_cold", "ours"), ("proteus_cold", "Proteus"), ("ours_nvcc_cold", "ours on nvcc"),
                                    ("ours_ptx_cold", "ours via PTX"))
                 if (d := paired(r, "plain_cold", key))]
        if d := paired(r, "nvcc_cold", "ours_nvcc_cold"):
            parts.append(f"ours on nvcc over nvcc AOT {d['median']:.3f}x ({d['min']:.3f}-{d['max']:.3f}, {d['n']} rounds)")
        if d := paired(r, "ours_cold", "ours_ptx_cold"):
            parts.append(f"ours via PTX over ours (bitcode) {d['median']:.3f}x ({d['min']:.3f}-{d['max']:.3f}, {d['n']} rounds)")
        if parts:
            lines.append(f"\n{p}, cold end to end paired by round (each round's plain wall time over the JIT's, "
                         f"run beside it; median, min-max): " + "; ".join(parts))
    for p, r in doc["programs"].items():
        g = r.get("gpu_ms") or {}
        if "plain" not in g:
            continue
        base = g["plain"]["median"]
        parts = [f"{label} {g[k]['median']:.2f} ({g[k]['min']:.2f}-{g[k]['max']:.2f})"
                 + ("" if k == "plain" else f", {base / g[k]['median']:.3f}x")
                 for k, label in (("plain", "plain"), ("native", "native"), ("ours_warm", "ours"), ("proteus_warm", "Proteus"),
                                  *NVCC_LABELS, *PTX_LABELS) if k in g]
        if "nvcc" in g and "ours_nvcc_warm" in g:
            parts.append(f"ours on nvcc over nvcc AOT {g['nvcc']['median'] / g['ours_nvcc_warm']['median']:.3f}x")
        if "ours_warm" in g and "ours_ptx_warm" in g:
            parts.append(f"ours via PTX over ours (bitcode) {g['ours_warm']['median'] / g['ours_ptx_warm']['median']:.3f}x")
        lines.append(f"\n{p}, kernel time on the GPU (CUPTI: the sum of its kernels per run, ms; {g['plain']['n']} traced rounds, "
                     f"warm; ratios over plain): " + "; ".join(parts))
        per = r.get("gpu_kernel_ms") or {}
        if "plain" in per and "ours_warm" in per:
            top = sorted(per["plain"], key=per["plain"].get, reverse=True)[:16]
            lines.append(f"\n{p}, per kernel (ms per run, plain / ours / Proteus): " + "; ".join(
                f"{n[:40]} {per['plain'][n]:.2f} / " + (f"{per['ours_warm'][n]:.2f}" if n in per["ours_warm"] else "-")
                + " / " + (f"{per['proteus_warm'][n]:.2f}" if n in per.get("proteus_warm", {}) else "-") for n in top))
        if "nvcc" in per and "ours_nvcc_warm" in per:
            top = sorted(per["nvcc"], key=per["nvcc"].get, reverse=True)[:16]
            lines.append(f"\n{p}, per kernel (ms per run, nvcc AOT / ours on nvcc): " + "; ".join(
                f"{n[:40]} {per['nvcc'][n]:.2f} / " + (f"{per['ours_nvcc_warm'][n]:.2f}" if n in per["ours_nvcc_warm"] else "-")
                for n in top))
        if "ours_warm" in per and "ours_ptx_warm" in per:
            top = sorted(per["ours_warm"], key=per["ours_warm"].get, reverse=True)[:16]
            lines.append(f"\n{p}, per kernel (ms per run, ours / ours via PTX): " + "; ".join(
                f"{n[:40]} {per['ours_warm'][n]:.2f} / " + (f"{per['ours_ptx_warm'][n]:.2f}" if n in per["ours_ptx_warm"] else "-")
                for n in top))
    for p, r in doc["programs"].items():
        if r.get("speed_trials"):
            lines.append(f"\n{p}, speed trials in the cold run (kernel: kept/slower/undecided variants, GPU time "
                         "against the original): " + "; ".join(
                             f"{t['kernel']}: {t['verdicts']['kept']}/{t['verdicts']['slower']}/{t['verdicts']['undecided']}"
                             + (f", {t['time_vs_original']:.2f}x" if t.get("time_vs_original") else "")
                             for t in r["speed_trials"]))
    for p, r in doc["programs"].items():
        if r.get("speed_trials_nvcc"):
            lines.append(f"\n{p}, speed trials in ours' cold run on the nvcc build (kernel: kept/slower/undecided "
                         "variants, GPU time against the original): " + "; ".join(
                             f"{t['kernel']}: {t['verdicts']['kept']}/{t['verdicts']['slower']}/{t['verdicts']['undecided']}"
                             + (f", {t['time_vs_original']:.2f}x" if t.get("time_vs_original") else "")
                             for t in r["speed_trials_nvcc"]))
    for p, r in doc["programs"].items():
        if r.get("speed_trials_ptx"):
            lines.append(f"\n{p}, speed trials in the cold run via PTX (kernel: kept/slower/undecided variants, GPU time "
                         "against the original): " + "; ".join(
                             f"{t['kernel']}: {t['verdicts']['kept']}/{t['verdicts']['slower']}/{t['verdicts']['undecided']}"
                             + (f", {t['time_vs_original']:.2f}x" if t.get("time_vs_original") else "")
                             for t in r["speed_trials_ptx"]))
    for spec, r in doc.get("extra", {}).items():
        nat = r.get("native", {}).get("runs") or [{}]
        said = {k: ("yes" if r[k]["all_ok"] else "NO") for k in ("ours_sync", "ours_warm") if k in r}
        lines.append(f"\n{spec}: native exit {nat[0].get('rc', '-')}; under the tool, output = native: "
                     f"cold with PROTEUS_ASYNC_COMPILATION=0 {said.get('ours_sync', '-')}, warm {said.get('ours_warm', '-')}"
                     + (f" ({r['error']})" if r.get("error") else ""))
    if doc.get("skipped_for_time"):
        lines.append(f"\nNot run (time budget): {', '.join(doc['skipped_for_time'])}")
    return "\n".join(lines) + "\n"


NVCC_LABELS = (("nvcc", "nvcc AOT"), ("ours_nvcc_warm", "ours on nvcc"))
PTX_LABELS = (("ours_ptx_warm", "ours via PTX"),)


def _side_table(doc: dict, keys: tuple[str, ...], error_key: str, intro: str, header: str, ratios_of, row) -> list[str]:
    """A table of one more series beside the others (nvcc_table, ptx_table): one row per program
    and metric, `row(prog, r, name, ratios)`; a program whose series failed before it ran, one
    row with why."""
    rows = [(p, r) for p, r in doc["programs"].items() if any(k in r for k in (*keys, error_key))]
    if not rows:
        return []
    columns = header.count("|") - 1
    lines = ["", intro, "", header, "|" + "---|" * columns]
    for prog, r in rows:
        if r.get(error_key) and not any(k in r for k in keys):
            lines.append(f"| {prog} | {r[error_key]} |" + " |" * (columns - 2))
            continue
        ratios = ratios_of(prog, r) or {}
        lines.extend(row(prog, r, name, ratios) for name, _, _better in PROGRAMS[prog][1])
    return lines


def nvcc_table(doc: dict) -> list[str]:
    """--nvcc: the nvcc builds beside the others, one row per program and metric: nvcc AOT,
    ours on it warm and cold, Proteus warm; ours on nvcc over nvcc AOT and over Proteus warm."""
    def row(prog: str, r: dict, name: str, ratios: dict) -> str:
        said = f" ({r['nvcc_error']})" if r.get("nvcc_error") else ""
        return (f"| {prog} | {name} | {_cell(r, 'plain', name)} | {_cell(r, 'nvcc', name)} "
                f"| {_cell(r, 'ours_nvcc_warm', name)}{said} | {_cell(r, 'ours_nvcc_cold', name)} "
                f"| {_cell(r, 'proteus_warm', name)} | {_ratio(ratios, name, 'ours_nvcc_vs_nvcc')} "
                f"| {_ratio(ratios, name, 'ours_nvcc_vs_proteus')} | {_cold_pair(r, 'nvcc_cold', 'ours_nvcc_cold')} "
                f"| {_same(r, 'nvcc', 'nvcc_cold')} | {_same(r, 'ours_nvcc_cold', 'ours_nvcc_warm', 'ours_nvcc_traced')} "
                f"| {_traced(r.get('cupti_nvcc'))} |")

    return _side_table(
        doc, ("nvcc", "nvcc_cold"), "nvcc_error",
        "**nvcc builds** (`--nvcc`): each program's nvcc build as HeCBench's Makefile builds it (SASS and PTX, "
        "no bitcode), natively (nvcc AOT) and under proteus-rewrite (the PTX route), in the same rounds as the "
        "columns above. Medians (min-max); ratios are speed-ups of ours on nvcc (>1 is faster): the ratio of "
        "medians, then (min-max) of the per-round ratios.",
        "| program | metric | plain | nvcc AOT | ours on nvcc warm | ours on nvcc cold | Proteus warm "
        "| ours-nvcc / nvcc AOT | ours-nvcc / Proteus warm | ours-nvcc cold e2e s (nvcc AOT / ours-nvcc) "
        "| nvcc = plain | ours-nvcc = nvcc | variant launches (CUPTI) |",
        nvcc_ratios, row)


def _cell(r: dict, key: str, name: str) -> str:
    """A series' figure in a table: median (min-max), or '-'."""
    m = ((r.get(key) or {}).get("metrics") or {}).get(name)
    return f"{m['median']:.4g} ({m['min']:.4g}-{m['max']:.4g})" if m else "-"


def _ratio(ratios: dict, name: str, label: str) -> str:
    """A speed-up of medians, then (min-max) of the per-round ones, or '-'."""
    x = (ratios.get(name) or {}).get(label)
    if not x:
        return "-"
    d = x.get("by_round")
    return f"{x['ratio']:.2f}x" + (f" ({d['min']:.2f}-{d['max']:.2f})" if d else "")


def _cold_pair(r: dict, ref: str, key: str) -> str:
    """Cold end to end seconds, the reference's / the series', and their ratio."""
    a, b = ((r.get(k) or {}).get("wall_s") for k in (ref, key))
    return (f"{a['median']:.2f} / {b['median']:.2f} ({a['median'] / b['median']:.2f}x)" if a and b
            else f"- / {b['median']:.2f}" if b else "-")


def _same(r: dict, *keys: str) -> str:
    """Whether every run of the series that ran printed its reference's output."""
    ran = [k for k in keys if (r.get(k) or {}).get("runs")]
    return "yes" if ran and all(r[k].get("all_ok", False) for k in ran) else "NO"


def _traced(c: dict | None) -> str:
    return f"{c['variant_launches']}/{c['launches']}" if c else "-"


def ptx_table(doc: dict) -> list[str]:
    """--ptx-route: main_all on the PTX route beside its bitcode route, one row per program and
    metric: native, ours warm, ours via PTX warm and cold, Proteus warm; ours via PTX over ours
    and over Proteus warm."""
    def row(prog: str, r: dict, name: str, ratios: dict) -> str:
        return (f"| {prog} | {name} | {_cell(r, 'native', name)} | {_cell(r, 'ours_warm', name)} "
                f"| {_cell(r, 'ours_ptx_warm', name)} | {_cell(r, 'ours_ptx_cold', name)} "
                f"| {_cell(r, 'proteus_warm', name)} | {_ratio(ratios, name, 'ours_ptx_vs_ours')} "
                f"| {_ratio(ratios, name, 'ours_ptx_vs_proteus')} | {_cold_pair(r, 'ours_cold', 'ours_ptx_cold')} "
                f"| {_same(r, 'ours_ptx_cold', 'ours_ptx_warm', 'ours_ptx_traced')} | {_traced(r.get('cupti_ptx'))} |")

    return _side_table(
        doc, ("ours_ptx_cold", "ours_ptx_warm"), "ptx_error",
        "**The PTX route on the clang build, beside the bitcode route** (`--ptx-route`): the recommended "
        "build (main_all) rewritten again with PROTEUS_CODE_KIND=ptx, its kernels recorded from the PTX it "
        "carries rather than its bitcode, in the same rounds as the columns above. Medians (min-max); ratios "
        "are speed-ups of ours via PTX (>1 is faster): the ratio of medians, then (min-max) of the per-round "
        "ratios.",
        "| program | metric | native (bitcode build) | ours warm | ours-ptx warm | ours-ptx cold | Proteus warm "
        "| ours-ptx / ours | ours-ptx / Proteus warm | ours-ptx cold e2e s (ours / ours-ptx) "
        "| ours-ptx = native | variant launches (CUPTI) |",
        ptx_ratios, row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--render"]:   # --render OUT JSON...: one report from several calls' JSON
        if len(argv) < 3:
            print("proteus_compare: --render OUT JSON [JSON...]", file=sys.stderr)
            return 2
        return render(argv[2:], Path(argv[1]))
    ap.add_argument("--hec", required=True, help="built programs: DIR/<program>/main_plain and main_all "
                                                   "(and main_nvcc, for --nvcc)")
    ap.add_argument("--proteus", required=True, help="the unpacked upstream bundle (bin/, lib/, src/)")
    ap.add_argument("--tool", required=True, help="the proteus-rewrite command")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", default="3", metavar="N[,PROG=N...]",
                    help="runs per series (at least 3), with other counts for some programs: 3,lulesh=7")
    ap.add_argument("--cold-reps", default="", metavar="N[,PROG=N...]",
                    help="cold rounds, where they differ from --reps (a host-bound program's end to end "
                         "needs more rounds than its kernel time)")
    ap.add_argument("--phase", choices=("both", "cold", "warm"), default="both",
                    help="cold or warm rounds only (a program too long for one call: the cold call leaves "
                         "its caches in --cache-dir for the warm one, which fills them itself when they are gone)")
    ap.add_argument("--cache-dir", default="", help="the JITs' caches (default OUT/cache)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--budget-s", type=float, default=420, help="start no program after this many seconds")
    ap.add_argument("--grace-s", type=float, default=100, help="and start no run this long after that")
    ap.add_argument("--programs", nargs="*", default=list(PROGRAMS), choices=list(PROGRAMS))
    ap.add_argument("--alt", nargs="*", default=[], metavar="PROTEUS_X=V",
                    help="every program also runs warm with these settings of ours (the series ours_alt_warm)")
    ap.add_argument("--extra", nargs="*", default=[], metavar="PROG=BUILD",
                    help="another build of a program, natively and under the tool, for output identity")
    ap.add_argument("--nvcc", action="store_true",
                    help="also each program's nvcc build (hec/PROG/main_nvcc): natively (nvcc AOT) and under the "
                         "tool, cold and warm, in the same rounds")
    ap.add_argument("--ptx-route", action="store_true",
                    help="also main_all rewritten with PROTEUS_CODE_KIND=ptx (its kernels recorded from their PTX, "
                         "not their bitcode), cold and warm, in the same rounds, beside ours on the bitcode route")
    ap.add_argument("--kernel-trace-lib", default="", help="a CUPTI injection library (bench/lib/kernel_trace.c)")
    ap.add_argument("--gpu-time-rounds", type=int, default=0, metavar="N",
                    help="after the warm rounds, N rounds of them traced with CUPTI: kernel time on the GPU")
    ap.add_argument("--commit", default=os.environ.get("PROTEUS_COMMIT", ""))
    ap.add_argument("--hecbench-commit", default="unknown")
    args = ap.parse_args(argv)
    for spec in args.extra:
        if "=" not in spec or spec.split("=", 1)[0] not in PROGRAMS:
            ap.error(f"--extra {spec!r}: PROG=BUILD, PROG one of {', '.join(PROGRAMS)}")
    for opt in ("reps", "cold_reps"):
        flag = "--" + opt.replace("_", "-")
        try:
            first, *more = getattr(args, opt).split(",")
            counts = {name: int(n) for name, n in (m.split("=", 1) for m in more)}
            setattr(args, opt, int(first or 0))
            setattr(args, opt + "_for", counts)
        except ValueError:
            ap.error(f"{flag} {getattr(args, opt)!r}: N or N,PROG=N,...")
        low = [n for n in [getattr(args, opt), *counts.values()] if n or opt == "reps"]
        if min(low, default=3) < 3 or not set(counts) <= set(PROGRAMS):
            ap.error(f"{flag}: at least 3 runs (medians of fewer say little), for programs of --programs")
    if 0 < args.gpu_time_rounds < 3:
        ap.error("--gpu-time-rounds: 0, or at least 3 (medians of fewer say little)")
    for need in (Path(args.hec), Path(args.proteus) / "bin"):
        if not need.is_dir():
            print(f"proteus_compare: {need}: no such directory", file=sys.stderr)
            return 2
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
