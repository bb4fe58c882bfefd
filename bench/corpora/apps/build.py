"""Build the benchmark workloads (bench/corpora/apps/*.cu) with clang-19 and -fembed-bitcode.

    python -m bench.corpora.apps.build                 # all six (and the samples' launch_overhead apps)
                                                       # for sm_90 into bench/corpora/apps/build/
    python -m bench.corpora.apps.build --arch sm_80    # another GPU architecture
    python -m bench.corpora.apps.build adam wsm5 --out /tmp/apps

The same machinery as samples/build.py (its App, make_compat_tree and build_app: the CUDA 13
stand-in headers and fatbinary wrapper, here in bench/corpora/apps/.build-tools/), static cudart, -O3. Apps are rebuilt when their
source, common.h or samples/build.py is newer than the binary, or the architecture changed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from samples import build as sb

HERE = Path(__file__).resolve().parent
App = sb.App

# name -> (App, what it models, the scalars the JIT folds)
APPS: dict[str, tuple] = {
    "adam": (App(("adam.cu",), note="ADAM-like optimizer step"),
             "ADAM: optimizer update with an in-kernel time-step loop",
             "beta1, beta2, eps, grad_scale, lr, time_steps, n, mode, weight_decay"),
    "rsbench": (App(("rsbench.cu",), note="RSBench-like multipole cross-section lookup"),
                "RSBench: Monte Carlo multipole cross-section lookups",
                "n_lookups, max_nucs, max_windows, max_poles, num_l, doppler, n_quad, seed"),
    "wsm5": (App(("wsm5.cu",), note="WSM5-like microphysics columns"),
             "WSM5: single-moment microphysics, one thread per column",
             "ncol, nz (level count), dt, and the physical constants"),
    "sw4ck": (App(("sw4ck.cu",), note="SW4CK-like 4th-order stencil, five kernels"),
              "SW4CK: 4th-order finite-difference elastic wave kernels",
              "ni, nj, nk (grid extents), h, dt, and the material scalars"),
    "feynman_kac": (App(("feynman_kac.cu",), note="Feynman-Kac random walks"),
                    "Feynman-Kac: random-walk integration inside an ellipsoid",
                    "a, b, c (semi-axes), h (step), n_walks, nx, ny, nz"),
    "lulesh": (App(("lulesh.cu",), note="LULESH-like hydro step, many launches"),
               "LULESH: Lagrangian hydrodynamics on a hex mesh, eight kernels per step",
               "mesh extents, material, hourglass and artificial-viscosity constants"),
}
# The samples' launch-overhead app, built here too so that bench/run.py finds everything it runs
# in one directory (bench/corpora/apps/build/ is all a GPU machine needs besides the repository).
SAMPLE_APPS = ("launch_overhead", "launch_overhead_dynamic")
TOOLS = HERE / ".build-tools"  # the CUDA 13 compatibility tree (symlinks into the toolkit), kept out of build/


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("apps", nargs="*", help=f"apps to build (default: all): {', '.join([*APPS, *SAMPLE_APPS])}")
    parser.add_argument("--out", default=str(HERE / "build"), help="output directory (default: bench/corpora/apps/build)")
    parser.add_argument("--arch", default=os.environ.get("SAMPLES_ARCH", "sm_90"), help="GPU architecture (default: sm_90)")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang++-19"))
    parser.add_argument("--cuda-path", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)

    unknown = [a for a in args.apps if a not in APPS and a not in SAMPLE_APPS]
    if unknown:
        parser.error(f"unknown app(s): {', '.join(unknown)}")
    for tool, hint in ((args.clang, "apt-get install clang-19 llvm-19 lld-19"),
                       (str(Path(args.cuda_path) / "bin" / "nvcc"), "install the CUDA toolkit or pass --cuda-path")):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench.corpora.apps.build: {tool} not found ({hint})")

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree, stubs = sb.make_compat_tree(TOOLS, Path(args.cuda_path))
    names = args.apps or [*APPS, *SAMPLE_APPS]
    if args.force:
        for n in names:
            (out / f".{n}.stamp").unlink(missing_ok=True)

    def build(name: str) -> str:
        if name in SAMPLE_APPS:
            return sb.build_app(name, sb.APPS[name], out, args, tree, stubs)
        return sb.build_app(name, APPS[name][0], out, args, tree, stubs, src=HERE)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(build, names):
            print(line, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
