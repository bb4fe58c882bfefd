"""Run one program many times under the tool, cold, to catch a rare crash with its evidence.

    python -m bench.crash_hunt --tool-dir DIR [--runs 40] [--jobs 2] [--asan] [--out OUT]
                               [--cwd D] [--env K=V ...] -- APP [ARGS...]

DIR is what `proteus-rewrite APP -o DIR` wrote (libproteus.so beside the kernel store). Each run
preloads DIR/libproteus.so with a cache directory of its own (the defaults' mode, cold), and
keeps its exit code, its time and the end of its stderr. --asan first rebuilds DIR/libproteus.so
from the source tree with AddressSanitizer (the original kept as libproteus.so.orig) and
preloads the compiler's libasan ahead of it: a heap error then stops the run with a report
naming the access and both stacks instead of a bare SIGABRT. CUDA maps memory where ASan keeps
its shadow gap, hence protect_shadow_gap=0. Writes OUT/crash-hunt.json and .md: every run, and
the distinct first lines of the stderr of those that failed.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib import harness
from bench.lib import provenance as suite
from proteus_rewrite.inject import shim

ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")
ASAN_OPTIONS = "protect_shadow_gap=0:detect_leaks=0:halt_on_error=1:abort_on_error=1"
TAIL = 4000  # characters of stderr kept: an ASan report's access and first stack frames


def asan_runtime(cc: str) -> str:
    """The compiler's libasan, to preload first ("" where the compiler has none)."""
    try:
        path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return ""
    return path if Path(path).is_absolute() and Path(path).exists() else ""


def prepare(tool_dir: Path, asan: bool, cc: str) -> str:
    """LD_PRELOAD for the runs; with `asan`, the sanitized shim built into tool_dir first."""
    lib = tool_dir / "libproteus.so"
    if not lib.is_file():
        raise SystemExit(f"crash_hunt: {lib}: not found (run proteus-rewrite APP -o {tool_dir} first)")
    if not asan:
        return str(lib)
    runtime = asan_runtime(cc)
    if not runtime:
        raise SystemExit(f"crash_hunt: {cc} has no libasan.so: --asan needs one")
    original = tool_dir / "libproteus.so.orig"
    if not original.exists():
        shutil.copy2(lib, original)
    shim.build(lib, cc=cc, flags=ASAN_FLAGS)
    return f"{runtime} {lib}"


def one(i: int, cmd: list[str], cwd: Path, preload: str, scratch: Path, extra: dict[str, str], asan: bool,
        timeout: float) -> dict:
    cache = scratch / f"cache-{i}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {"LD_PRELOAD": preload, "PROTEUS_CACHE_DIR": str(cache), "PROTEUS_REPORT": str(scratch / f"report-{i}.json"),
           **({"ASAN_OPTIONS": ASAN_OPTIONS} if asan else {}), **extra}
    done = harness.execute(cmd, cwd, env, timeout)
    return {"run": i, "rc": done["rc"], "seconds": done["seconds"], "stderr_tail": done["stderr"][-TAIL:]}


def first_error(stderr: str) -> str:
    """The line that names what went wrong: ASan's summary or error line, glibc's abort message,
    else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for marker in ("SUMMARY: AddressSanitizer", "ERROR: AddressSanitizer", "(): ", "Fatal Python error", "Segmentation"):
        hit = next((line for line in lines if marker in line), None)
        if hit:
            return hit[:200]
    return (lines[-1] if lines else "(no stderr)")[:200]


def markdown(doc: dict) -> str:
    runs = doc["runs"]
    failed = [r for r in runs if r["rc"] != 0]
    rcs = collections.Counter(r["rc"] for r in runs)
    out = ["# Crash hunt", ""]
    out += [f"- {k}: `{v}`" for k, v in doc["header"].items()]
    out += ["", f"{len(runs)} cold runs, {len(failed)} failed; exit codes: "
            + ", ".join(f"{rc}: {n}" for rc, n in sorted(rcs.items())), ""]
    if failed:
        out += ["| first error line | runs |", "|---|---|"]
        for line, n in collections.Counter(first_error(r["stderr_tail"]) for r in failed).most_common():
            out.append(f"| {line.replace('|', '/')} | {n} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crash_hunt", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tool-dir", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--asan", action="store_true")
    ap.add_argument("--cc", default=shutil.which("cc") or "cc")
    ap.add_argument("--cwd", type=Path, default=Path.cwd())
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("crash-hunt"))
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("the program to run goes after --")
    if args.runs < 1 or args.jobs < 1:
        ap.error("--runs and --jobs must be at least 1")
    extra = dict(kv.split("=", 1) for kv in args.env if "=" in kv)
    preload = prepare(args.tool_dir.resolve(), args.asan, args.cc)
    scratch = args.out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(lambda i: one(i, cmd, args.cwd, preload, scratch.resolve(), extra, args.asan, args.timeout),
                             range(args.runs)))
    for r in runs:
        harness.log(f"run {r['run']}: rc {r['rc']}, {r['seconds']} s" + (f": {first_error(r['stderr_tail'])}" if r["rc"] else ""))
    header = {"commit": os.environ.get("PROTEUS_COMMIT") or suite.git_commit(short=True) or "unknown",
              "gpu": harness.gpu_name("nvidia-smi") or "none", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": " ".join(["python -m bench.crash_hunt", *(argv if argv is not None else sys.argv[1:])]),
              "asan": args.asan, "jobs": args.jobs}
    doc = {"header": header, "runs": runs}
    harness.write_files(args.out, {"crash-hunt.json": json.dumps(doc, indent=1) + "\n", "crash-hunt.md": markdown(doc)})
    print(markdown(doc), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
