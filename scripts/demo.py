#!/usr/bin/env python3
"""The README's first command (`make demo`): record every sample app with proteus-rewrite,
show its kernel table, and, when a GPU is present, run each app natively and print its
checksums.

    python3 scripts/demo.py [--build samples/build] [--out proteus-out] [--log FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proteus_rewrite import gpu  # noqa: E402
from samples.build import APPS  # noqa: E402


def proteus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", *args], capture_output=True, text=True)


def checksums(stdout: str) -> dict[str, str]:
    return {parts[1]: parts[2] for parts in (line.split() for line in stdout.splitlines()) if len(parts) == 3 and parts[0] == "checksum"}


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
        expected_rc = 6 if app.compiler == "nvcc" else 0  # the nvcc build has no bitcode: refused
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
        print(f"== running the samples natively on {status.reason}")
        for name in APPS:
            t0 = time.perf_counter()
            res = subprocess.run([str(build / name)], capture_output=True, text=True)
            dt = time.perf_counter() - t0
            sums = checksums(res.stdout)
            summary["apps"][name].update(native_rc=res.returncode, native_s=round(dt, 3), checksums=sums,
                                         stdout=res.stdout, stderr=res.stderr[-2000:])
            state = "ok" if res.returncode == 0 and sums else f"FAILED (exit {res.returncode})"
            print(f"  {name:26} {state:8} {dt:6.2f} s  " + " ".join(f"{k}={v}" for k, v in sums.items()))
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
    if args.log:
        Path(args.log).write_text(json.dumps(summary, indent=2))
    failed = [n for n, a in summary["apps"].items() if a.get("native_rc", 0) != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
