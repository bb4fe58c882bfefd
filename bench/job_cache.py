"""Many processes of one app over the GPUs of a host, cold, sharing a cache tier: how many
compilations the job made against the distinct variants it needed, whether every output is the
native one, and what the GPU ran (CUPTI), per tier (issue #52).

    python -m bench.job_cache --app samples/build/two_tu_shared --procs 16 --tiers file,redis,none \
        --out OUT [--redis-server PATH] [--kernel-trace LIB] [--args ...]

Each process is a rank (SLURM_PROCID) on a node of its own (a node-local cache directory of its
own), pinned to GPU rank % GPUs. Tiers: `file` (PROTEUS_CACHE_SHARED=file:///...), `redis` (a
redis-server started here on a unix socket) and `none` (per-process caches only, the baseline for
wall time). Compilations and cache keys come from each process's PROTEUS_REPORT; the outputs are
compared with a native run's after masking the lines named by --mask (regular expressions).
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


def gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        return 1
    return max(1, sum(line.startswith("GPU ") for line in out.splitlines()))


def masked(text: str, masks: list[re.Pattern]) -> list[str]:
    return [line for line in text.splitlines() if not any(m.search(line) for m in masks)]


def start_redis(server: str, where: Path) -> tuple[subprocess.Popen, str]:
    sock = where / "redis.sock"
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if sock.exists():
            return proc, f"redis+unix://{sock}?db=0"
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{server}: no socket after 5 s")


def run_tier(tier: str, args, work: Path, native: list[str], masks) -> dict:
    base = work / tier
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    env0 = {k: v for k, v in os.environ.items() if not k.startswith("PROTEUS_")}
    env0["LD_PRELOAD"] = str(Path(args.tool_dir) / "libproteus.so")
    redis = None
    if tier == "file":
        env0["PROTEUS_CACHE_SHARED"] = f"file://{base / 'shared'}"
    elif tier == "redis":
        redis, url = start_redis(args.redis_server, Path(tempfile.mkdtemp(prefix="rs")))
        env0["PROTEUS_CACHE_SHARED"] = url
    n_gpus = gpus()
    procs = []
    t0 = time.monotonic()
    try:
        for rank in range(args.procs):
            env = dict(env0, SLURM_PROCID=str(rank), CUDA_VISIBLE_DEVICES=str(rank % n_gpus),
                       PROTEUS_CACHE_DIR=str(base / f"node{rank}"), PROTEUS_REPORT=str(base / "run.%r.json"))
            if args.kernel_trace:
                env.update(CUDA_INJECTION64_PATH=args.kernel_trace, CUPTI_KERNEL_TRACE_FILE=str(base / f"kernels.{rank}.txt"))
            procs.append(subprocess.Popen([args.app, *args.args], cwd=args.cwd or None, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    finally:
        wall = time.monotonic() - t0
        if redis is not None:
            redis.kill()
    compiled, keys, claims, same, variants_by_gpu = 0, set(), {}, 0, {}
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        same += p.returncode == 0 and masked(out, masks) == native
        try:
            doc = json.loads((base / f"run.{rank}.json").read_text())
        except (OSError, ValueError):
            continue
        for k in doc.get("kernels", []):
            compiled += int(k.get("specializations", 0))
            keys |= {v["cache_key"] for v in k.get("variants", []) if v.get("cache_key")}
        for name, value in (doc.get("claims") or {}).items():
            claims[name] = claims.get(name, 0) + value
        trace = base / f"kernels.{rank}.txt"
        if trace.exists():
            names = [line.split("\t", 1)[0] for line in trace.read_text().splitlines() if line and not line.startswith("#")]
            gpu = rank % n_gpus
            ran = variants_by_gpu.setdefault(gpu, [0, 0])
            ran[0] += sum("$proteus$" in n for n in names)
            ran[1] += sum("$proteus$" not in n for n in names)
    return {"tier": tier, "procs": args.procs, "gpus": n_gpus, "wall_s": round(wall, 2), "native_outputs": same,
            "compilations": compiled, "distinct_keys": len(keys), "claims": claims,
            "variants_originals_by_gpu": {str(g): v for g, v in sorted(variants_by_gpu.items())},
            "stderr_sample": next((e[-300:] for _, e in outs if e.strip()), "")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", required=True, help="the executable (its original)")
    ap.add_argument("--tool-dir", required=True, help="the directory proteus-rewrite wrote for it")
    ap.add_argument("--args", nargs="*", default=[])
    ap.add_argument("--cwd")
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--tiers", default="file,redis,none")
    ap.add_argument("--rounds", type=int, default=1, help="cold rounds per tier (wall times: median)")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    ap.add_argument("--kernel-trace")
    ap.add_argument("--mask", action="append", default=[], help="regex of output lines left out of the comparison")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    masks = [re.compile(m) for m in args.mask]
    native = subprocess.run([args.app, *args.args], cwd=args.cwd or None, capture_output=True, text=True)
    if native.returncode != 0:
        raise SystemExit(f"{args.app}: native run exited {native.returncode}")
    want = masked(native.stdout, masks)
    work = Path(tempfile.mkdtemp(prefix="jobcache"))
    results = []
    for tier in [t for t in args.tiers.split(",") if t]:
        rounds = [run_tier(tier, args, work, want, masks) for _ in range(args.rounds)]
        r = dict(rounds[-1])
        r["wall_s_rounds"] = [x["wall_s"] for x in rounds]
        r["wall_s"] = statistics.median(r["wall_s_rounds"])
        results.append(r)
        print(json.dumps(r), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job-cache.json").write_text(json.dumps({"app": args.app, "args": args.args, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
