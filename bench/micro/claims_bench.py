"""64 processes miss one key at once, per shared tier: how many compile it (counted by the
processes, in an append-only log) and how long each waits for the variant (issue #52).

    python -m bench.micro.claims_bench [--procs 64] [--compile-s 0.2 1.0] [--out FILE.json]

Each process is a rank with a node-local directory of its own (8 nodes), sharing a `file://`
tier or a Redis server (started here on a unix socket; skipped when redis-server is missing),
and runs the chain's acquire / compile / publish with a stand-in compile that sleeps.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proteus_rewrite.cache import Entry, make_chain
from proteus_rewrite.tiers import open_shared

KEY = "c1a1b5" + "0" * 58
CTX = multiprocessing.get_context("fork")


def rank(url: str, local: str, log: str, out: str, compile_s: float, barrier) -> None:
    chain = make_chain(True, local, shared=open_shared(url, None, None, 30.0))
    barrier.wait()
    t0 = time.monotonic()
    hit = chain.get(KEY)
    while hit is None:
        got = chain.acquire(KEY, wait_s=60)
        if isinstance(got, tuple):
            hit = got
            break
        if got is None:
            continue
        try:
            with chain.renewing(got, every_s=5):
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, f"{os.getpid()}\n".encode())
                os.close(fd)
                time.sleep(compile_s)
            chain.put(Entry(KEY, "cubin", 90, b"variant", {"kernel": "k"}))
        finally:
            chain.release(got)
        hit = (None, "compiled")
    Path(out).write_text(json.dumps({"waited_s": time.monotonic() - t0, "how": hit[1]}))


def one(url: str, procs: int, compile_s: float, work: Path) -> dict:
    log = work / "compiles.log"
    barrier = CTX.Barrier(procs)
    ps = [CTX.Process(target=rank, args=(url, str(work / f"node{i % 8}"), str(log), str(work / f"out{i}.json"),
                                         compile_s, barrier)) for i in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(300)
    outs = [json.loads((work / f"out{i}.json").read_text()) for i in range(procs) if (work / f"out{i}.json").exists()]
    waits = sorted(o["waited_s"] for o in outs if o["how"] != "compiled")
    return {"procs": procs, "finished": len(outs), "compile_s": compile_s,
            "compilations": len(log.read_text().split()) if log.exists() else 0,
            "wait_s_median": round(statistics.median(waits), 3) if waits else None,
            "wait_s_max": round(max(waits), 3) if waits else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--compile-s", type=float, nargs="+", default=[0.2, 1.0])
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    results = []
    server = shutil.which("redis-server")
    for tier in ("file", "redis"):
        for compile_s in args.compile_s:
            work = Path(tempfile.mkdtemp(prefix="claims"))
            redis = None
            if tier == "file":
                url = f"file://{work / 'shared'}"
            elif server:
                sock = work / "r.sock"
                redis = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(100):
                    if sock.exists():
                        break
                    time.sleep(0.05)
                url = f"redis+unix://{sock}?db=0"
            else:
                print("redis-server not found: the Redis tier is skipped", file=sys.stderr)
                continue
            try:
                r = {"tier": tier, **one(url, args.procs, compile_s, work)}
            finally:
                if redis is not None:
                    redis.kill()
                shutil.rmtree(work, ignore_errors=True)
            results.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
