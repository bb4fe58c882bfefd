"""Real programs that run kernels as CUDA graph nodes, built for tests/gpu/test_gpu_graphs.py.

NVIDIA's cuda-samples jacobiCudaGraphs (a hand-built graph whose kernel node is given new
arguments every iteration by cudaGraphExecKernelNodeSetParams; or a capture applied by
cudaGraphExecUpdate every iteration), simpleCudaGraphs (cudaGraphAddKernelNode by hand, stream
capture, cloned graphs) and graphMemoryNodes (memory nodes around kernel nodes), plus HeCBench
graphExecution (stream capture, replayed). Fetched from git mirrors at pinned commits, never
copied into this repository; built by clang-19 in two recipes, `plain` and `recommended`, with
the project's own build code (bench/corpora/hecbench/build.py).

    python -m bench.graph_programs --out bench/work/graphs            # build
    python -m bench.graph_programs --out bench/work/graphs --pack .gpu/graphs.tar.xz

On the GPU host: GRAPH_PROGRAMS=<unpacked folder> python -m pytest -m gpu tests/gpu/test_gpu_graphs.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

from bench.corpora.hecbench import build as hecbench_build

CUDA_SAMPLES = ("/work/.mirror/NVIDIA+cuda-samples/repo", "c94ff366aed18c797b8a85dfaac7817b0228b420")
HECBENCH = ("/work/.mirror/zjin-lcf+HeCBench/repo", "f27000a5188f8ac79bd43fc95a1b3f890c18823d")
COMMON_HEADERS = ("helper_cuda.h", "helper_functions.h", "helper_timer.h", "helper_string.h", "helper_image.h", "exception.h")
PROGRAMS = {   # name: (repository, folder in it, CUDA sources, host C++ sources)
    "jacobiCudaGraphs": (CUDA_SAMPLES, "Samples/3_CUDA_Features/jacobiCudaGraphs", ["jacobi.cu"], ["main.cpp"]),
    "simpleCudaGraphs": (CUDA_SAMPLES, "Samples/3_CUDA_Features/simpleCudaGraphs", ["simpleCudaGraphs.cu"], []),
    "graphMemoryNodes": (CUDA_SAMPLES, "Samples/3_CUDA_Features/graphMemoryNodes", ["graphMemoryNodes.cu"], []),
    "graphExecution": (HECBENCH, "src/graphExecution-cuda", ["main.cu"], []),
}
RECIPES = ("plain", "recommended")


def git(mirror: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], check=True, capture_output=True, **kw)


def fetch(name: str, src_root: Path) -> Path:
    (mirror, commit), folder, *_ = PROGRAMS[name]
    dest = src_root / name
    if not dest.is_dir():
        dest.mkdir(parents=True)
        archive = git(mirror, "archive", commit, folder).stdout
        subprocess.run(["tar", "-x", "--strip-components", str(folder.count("/") + 1), "-C", str(dest)], input=archive, check=True)
    common = src_root / "Common"
    if mirror == CUDA_SAMPLES[0] and not common.is_dir():
        common.mkdir()
        for h in COMMON_HEADERS:
            (common / h).write_bytes(git(mirror, "show", f"{commit}:Common/{h}").stdout)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="work folder: sources, compat tree, build/<recipe>/<program>")
    ap.add_argument("--pack", type=Path, help="then write the builds to this .tar.xz (unpacks to graphs/<recipe>/<program>)")
    ap.add_argument("--clang", default="clang++-19")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--cuda-path", default="/usr/local/cuda")
    args = ap.parse_args(argv)
    work = args.out.resolve()
    env = hecbench_build.BuildEnv(argparse.Namespace(clang=args.clang, arch=args.arch, cuda_path=args.cuda_path, work=str(work)))
    env.build_root = work / "build"
    failed = []
    for name, (_, _, sources, cxx) in PROGRAMS.items():
        src = fetch(name, work / "src")
        program = {"name": name, "sources": sources, "cxx_sources": cxx, "flags": ["-I", str(work / "src" / "Common")]}
        for recipe in RECIPES:
            exe = env.build_root / recipe / name
            hecbench_build.host_object(exe, "x").parent.mkdir(parents=True, exist_ok=True)
            for cmd in [*hecbench_build.host_commands(program, recipe, src, exe, env),
                        hecbench_build.compile_command(program, recipe, src, exe, env)]:
                r = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
                if r.returncode:
                    failed.append(f"{recipe}/{name}: {hecbench_build.first_error(r.stderr)}")
                    break
            else:
                print(f"built {exe}", flush=True)
    for f in failed:
        print(f"graph_programs: {f}", file=sys.stderr)
    if failed:
        return 1
    if args.pack:
        with tarfile.open(args.pack, "w:xz") as tar:
            for recipe in RECIPES:
                for name in PROGRAMS:
                    tar.add(env.build_root / recipe / name, f"graphs/{recipe}/{name}")
        print(f"packed {args.pack}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
