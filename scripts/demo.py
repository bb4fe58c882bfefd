#!/usr/bin/env python3
"""The README's first command (`make demo`): record every sample app with proteus-rewrite,
show its kernel table, and, when a GPU is present, run each app natively and then under
LD_PRELOAD=libproteus.so (twice: an empty JIT cache, then a warm one), and check that every
checksum matches the native run.

    python3 -m scripts.demo [--build samples/build] [--out proteus-out] [--log FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from proteus_rewrite import gpu
from samples.build import APPS

ROOT = Path(__file__).resolve().parent.parent


def proteus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", *args], capture_output=True, text=True)


def checksums(stdout: str) -> dict[str, str]:
    return {parts[1]: parts[2] for parts in (line.split() for line in stdout.splitlines()) if len(parts) == 3 and parts[0] == "checksum"}


def sass_only(app) -> bool:
    """An nvcc build with machine code only (nvcc_arch naming no compute_XX in code=)."""
    return app.compiler == "nvcc" and bool(app.nvcc_arch) and not any("code=compute" in a for a in app.nvcc_arch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "samples" / "build"))
    ap.add_argument("--out", default=str(ROOT / "proteus-out"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--log", help="also write a JSON summary here")
    args = ap.parse_args()

    build = Path(args.build)
    summary = {"gpu": None, "apps": {}}
    print("== recording the samples")
    for name, app in APPS.items():
        exe = build / name
        if not exe.exists():
            print(f"{name}: not built (run: python3 samples/build.py)")
            return 1
        res = proteus(str(exe), "-o", str(Path(args.out) / name))
        line = (res.stdout or res.stderr).strip().splitlines()[-1]
        print(f"  {line}")
        summary["apps"][name] = {"record_rc": res.returncode}
        expected_rc = 6 if sass_only(app) else 0  # nothing to specialize: refused, with the fix
        if res.returncode != expected_rc:
            print(f"{name}: unexpected exit code {res.returncode}")
            return 1

    print("\n== kernel table of one sample (proteus-rewrite inspect samples/build/templates)")
    print(proteus("inspect", str(build / "templates")).stdout)

    status = gpu.status()
    summary["gpu"] = status.reason
    if not status.available:
        print(f"== no GPU here ({status.reason}): skipping the runs")
    else:
        print(f"== running the samples on {status.reason}: native, then JIT (cold cache), then JIT (warm cache)")
        cache = Path(args.out) / ".jit-cache"
        for name, app in APPS.items():
            runs = {}
            for mode in ("native", "cold", "warm"):
                env = dict(os.environ)
                if mode != "native":
                    shim = Path(args.out) / (name if not sass_only(app) else "loop_count") / "libproteus.so"
                    env.update(LD_PRELOAD=str(shim), PROTEUS_CACHE_DIR=str(cache / name))
                    if mode == "cold":
                        import shutil

                        shutil.rmtree(cache / name, ignore_errors=True)
                t0 = time.perf_counter()
                res = subprocess.run([str(build / name)], capture_output=True, text=True, env=env)
                runs[mode] = (res, time.perf_counter() - t0)
            native = runs["native"][0]
            sums = checksums(native.stdout)
            same = all(checksums(r.stdout) == sums and r.returncode == 0 for r, _ in runs.values())
            summary["apps"][name].update(native_rc=native.returncode, checksums=sums, identical_under_jit=same,
                                         seconds={m: round(dt, 3) for m, (_, dt) in runs.items()})
            state = "ok" if native.returncode == 0 and sums and same else "MISMATCH" if native.returncode == 0 else "FAILED"
            times = "  ".join(f"{m} {dt:5.2f}s" for m, (_, dt) in runs.items())
            print(f"  {name:26} {state:8} {times}  " + " ".join(f"{k}={v}" for k, v in sums.items()))
            if state != "ok":
                for r, _ in runs.values():
                    print(r.stderr[-2000:], file=sys.stderr)
    if args.log:
        Path(args.log).write_text(json.dumps(summary, indent=2))
    failed = [n for n, a in summary["apps"].items() if a.get("native_rc", 0) != 0 or not a.get("identical_under_jit", True)]
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
