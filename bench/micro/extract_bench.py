"""Extraction speed on a synthetic large executable (target: 200 MB, 1,000 kernels, <= 5 s).

    python -m bench.micro.extract_bench [--kernels 1000] [--tus 10] [--size-mb 200] [--repeat 5]

Builds (once, cached in bench/work/) an executable from --tus generated translation units
holding --kernels kernels in all, each with scalar and pointer parameters and a loop,
compiled by clang-19 with -fembed-bitcode, padded with an .incbin blob of random bytes to
--size-mb. Then times the whole command `proteus-rewrite APP -o DIR` (a fresh process each
time, so imports count) and, in-process, each stage. Writes bench/results/extract-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib.paths import RESULTS, ROOT, WORK
from samples.build import make_compat_tree

KERNEL = """
__global__ void k{i}(float *out, const float *in, int n, int iters, float a) {{
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float v = in[t];
  for (int j = 0; j < iters; ++j) v = v * a + {c}.0f;
  out[t] = v;
}}
"""


def build(work: Path, kernels: int, tus: int, size_mb: int, cuda: Path) -> Path:
    exe = work / f"synthetic_{kernels}k_{tus}tu_{size_mb}mb"
    if exe.exists():
        return exe
    work.mkdir(parents=True, exist_ok=True)
    tree, stubs = make_compat_tree(work, cuda)
    per_tu = (kernels + tus - 1) // tus
    sources = []
    for t in range(tus):
        ids = range(t * per_tu, min(kernels, (t + 1) * per_tu))
        src = work / f"tu{t}.cu"
        src.write_text("".join(KERNEL.format(i=i, c=i % 97) for i in ids))
        sources.append(src)
    (work / "main.cu").write_text("int main() { return 0; }\n")
    blob = work / "blob.bin"
    padding = max(0, size_mb * 1_000_000 - 2_000_000)
    with open(blob, "wb") as f:
        f.write(os.urandom(padding))
    (work / "blob.s").write_text(f'.section .rodata.blob,"a"\n.incbin "{blob}"\n.section .note.GNU-stack,"",@progbits\n')
    flags = ["clang++-19", "-x", "cuda", f"--cuda-path={tree}", "-I", str(stubs), "--cuda-gpu-arch=sm_90",
             "-O3", "-fembed-bitcode", "-Wno-unknown-cuda-version", "-c"]

    def compile_one(src: Path) -> str:
        obj = src.with_suffix(".o")
        subprocess.run([*flags, str(src), "-o", str(obj)], check=True)
        return str(obj)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, sources + [work / "main.cu"]))
    subprocess.run(["clang++-19", "-c", str(work / "blob.s"), "-o", str(work / "blob.o")], check=True)
    subprocess.run(["clang++-19", *objs, str(work / "blob.o"), "-L", str(cuda / "lib64"), "-lcudart_static",
                    "-ldl", "-lrt", "-lpthread", "-o", str(exe)], check=True)
    return exe


def stages(exe: Path, outdir: Path) -> dict[str, float]:
    """One in-process extraction, timed stage by stage."""
    from proteus_rewrite import store
    from proteus_rewrite.fatbin import bitcode, container, hostelf, kernels

    t = {}
    t0 = time.perf_counter()
    data = kernels.read_input(exe)
    t["read"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    elf = hostelf.parse(data)
    t["host_elf"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    conts = container.parse_section(elf.sections[".nv_fatbin"].data)
    t["containers"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = kernels.build(data, str(exe))
    t["kernel_table_total"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for m in table.modules:
        bitcode.analyze(m.code)
    t["bitcode_analysis"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.write(table, store.store_path(outdir, exe.name))
    t["store_write"] = time.perf_counter() - t0
    t["containers_found"] = len(conts)
    t["kernels_found"] = len(table.kernels)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=1000)
    ap.add_argument("--tus", type=int, default=10)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cuda-path", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args()

    work = Path(args.work)
    exe = build(work, args.kernels, args.tus, args.size_mb, Path(args.cuda_path))
    outdir = work / "out"
    walls = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "proteus_rewrite.cli", str(exe), "-o", str(outdir)],
                              capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
    detail = stages(exe, outdir)
    import lief
    import llvmlite

    result = {
        "benchmark": "extraction of a synthetic executable",
        "command": "python -m bench.micro.extract_bench " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "lief": lief.__version__, "llvmlite": llvmlite.__version__},
        "input": {"bytes": exe.stat().st_size, "kernels": detail["kernels_found"], "translation_units": args.tus,
                  "fat_binary_containers": detail["containers_found"]},
        "whole_command_seconds": {"runs": [round(w, 3) for w in walls], "median": round(statistics.median(walls), 3),
                                  "min": round(min(walls), 3), "max": round(max(walls), 3)},
        "stages_seconds": {k: round(v, 4) for k, v in detail.items() if isinstance(v, float)},
        "target_seconds": 5.0,
    }
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"extract-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
