#!/usr/bin/env python3
"""Build the sample apps with clang-19 and the recommended recipe, `-Xclang -fembed-bitcode=all`
(one with the older driver flag -fembed-bitcode, one with nvcc and no bitcode).

    python3 samples/build.py                 # all apps for sm_90 into samples/build/
    python3 samples/build.py --arch sm_80    # another GPU architecture
    python3 samples/build.py loop_count two_tu --out /tmp/apps
    python3 -m samples.build                 # the same, from the repository's top without the package installed

clang-19 predates CUDA 13: the two fixes it needs (stand-ins for headers clang's CUDA wrapper
includes but CUDA 13 lacks, and a --cuda-path tree whose bin/fatbinary translates clang's
`--image=profile=sm_90,file=X` into CUDA 13's `--image3=kind=elf,sm=90,file=X`) come from the
package's build wrapper, proteus_rewrite/cc.py (proteus-clang++), made here under
<out>/compat/ so that nothing outside the output directory is touched.
Apps are rebuilt only when a source or this script is newer than the binary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from proteus_rewrite import cc  # installed (make venv), or from the checkout with `python -m samples.build`

HERE = Path(__file__).resolve().parent
# proteus_rewrite's own recipe (fatbin/recipe.py), repeated here; tests/cpu/test_recipe.py
# checks that the two agree.
# exact-fp: the recommended recipe with floating-point contraction limited to what the source
# writes as one expression, so a variant fuses the same multiply-adds as the AOT code
# (docs/user/build.md: Identical floating-point results).
RECIPES = {"recommended": ("-Xclang", "-fembed-bitcode=all"),
           "exact-fp": ("-Xclang", "-fembed-bitcode=all", "-ffp-contract=on"),
           "fembed-bitcode": ("-fembed-bitcode",)}
SRC = HERE / "src"


@dataclass(frozen=True)
class App:
    sources: tuple[str, ...]
    cudart: str = "static"  # how the CUDA runtime is linked: static (the common case) or dynamic
    compress: str | None = None  # fatbinary --compress-mode; None = CUDA 13's default (zstd PTX)
    compiler: str = "clang"  # "nvcc": no embedded bitcode; "mixed": the last source built by nvcc;
    #                          "driver": host C++ on the driver API + device code embedded as a fat binary
    extra_archs: tuple[str, ...] = ()
    rdc: bool = False  # separate compilation (-fgpu-rdc) + nvcc -dlink device link
    pie: bool = True  # False: a position-dependent executable (-no-pie)
    recipe: str = "recommended"  # how bitcode is embedded: "recommended" or "fembed-bitcode" (clang's driver flag)
    lib_sources: tuple[str, ...] = ()  # built into lib<name>.so beside the app, which loads it through $ORIGIN
    nvcc_arch: tuple[str, ...] = ()  # nvcc's architecture flags in place of -arch=<arch> (e.g. SASS only)
    note: str = field(default="", compare=False)


APPS: dict[str, App] = {
    "loop_count": App(("loop_count.cu",), note="scalar trip counts; int, float, double, bool, 64-bit scalars"),
    "loop_count_dynamic": App(("loop_count.cu",), cudart="dynamic", note="same app, dynamic cudart"),
    "loop_count_lz4": App(("loop_count.cu",), compress="speed", note="PTX compressed with LZ4"),
    "loop_count_uncompressed": App(("loop_count.cu",), compress="none", note="no compression"),
    "loop_count_zstd_all": App(("loop_count.cu",), compress="size", note="cubin and PTX compressed with zstd"),
    "loop_count_multi_arch": App(("loop_count.cu",), extra_archs=("sm_80",), note="two architectures"),
    "loop_count_nopie": App(("loop_count.cu",), pie=False, note="a non-PIE executable"),
    "loop_count_nvcc": App(("loop_count.cu",), compiler="nvcc", note="nvcc build: no bitcode, compute_90 PTX"),
    "loop_count_sass": App(("loop_count.cu",), compiler="nvcc", nvcc_arch=("-gencode", "arch=compute_90,code=sm_90"),
                           note="nvcc build with SASS only: nothing to specialize"),
    "device_globals_nvcc": App(("device_globals.cu",), compiler="nvcc", note="device variables, nvcc build"),
    "templates_nvcc": App(("templates.cu",), compiler="nvcc", note="a by-value struct, launch bounds; nvcc build"),
    "multi_kernel_nvcc": App(("multi_kernel.cu",), compiler="nvcc", note="four kernels, shared memory; nvcc build"),
    "warp_reduce_nvcc": App(("warp_reduce.cu",), compiler="nvcc", note="shuffles, cooperative groups; nvcc build"),
    "rdc_nvcc": App(("rdc_main.cu", "rdc_device.cu"), compiler="nvcc", rdc=True,
                    note="nvcc -rdc=true: a kernel calling a function and a variable of another file"),
    "cdp_nvcc": App(("cdp.cu",), compiler="nvcc", rdc=True,
                    note="dynamic parallelism: a kernel launching a kernel (the device runtime's PTX is newer)"),
    "loop_count_fembed": App(("loop_count.cu",), recipe="fembed-bitcode",
                             note="the older recipe, clang's -fembed-bitcode: sm_30 PTX, optimized module"),
    "warp_reduce": App(("warp_reduce.cu",), note="warp shuffles, cooperative groups, a vote"),
    "warp_sync": App(("warp_sync.cu",), note="legacy warp-synchronous updates through memory (races the check must catch)"),
    "device_globals": App(("device_globals.cu",), note="__device__ and __constant__ variables"),
    "multi_kernel": App(("multi_kernel.cu",), note="four kernels in one translation unit"),
    "two_tu": App(("two_tu_main.cu", "two_tu_kernels.cu"), note="two .cu files, two fat binaries"),
    "two_tu_rdc": App(("two_tu_main.cu", "two_tu_kernels.cu"), rdc=True, note="-fgpu-rdc + nvcc -dlink"),
    "mixed_nvcc": App(("two_tu_main.cu", "two_tu_kernels.cu"), compiler="mixed",
                      note="one TU by clang with bitcode, one by nvcc without"),
    "driver_api": App(("driver_api.cpp", "driver_api_kernels.cu"), compiler="driver",
                      note="driver API: cuModuleLoadData of an embedded fat binary, no runtime"),
    "launch_overhead": App(("launch_overhead.cu",), note="100,000 launches of a tiny kernel"),
    "launch_overhead_dynamic": App(("launch_overhead.cu",), cudart="dynamic", note="the same, dynamic cudart"),
    "changing_scalars": App(("changing_scalars.cu",), note="a scalar that changes every launch; 1 or 8 threads, verified"),
    "templates": App(("templates.cu",), note="templates, struct by value, __launch_bounds__"),
    "annotated": App(("annotated.cu",), note='annotate("jit", 2, 3)'),
    "launch_paths": App(("launch_paths.cu",), note="NULL-argument launch, >48 KiB dynamic shared memory, function attributes"),
    "shared_lib": App(("shared_lib_main.cpp",), lib_sources=("shared_lib_kernels.cu",),
                      note="every kernel in a shared library (static cudart there); the executable has no GPU code"),
    "shared_lib_dynamic": App(("shared_lib_main.cpp",), lib_sources=("shared_lib_kernels.cu",), cudart="dynamic",
                              note="the same, the library on the dynamic cudart"),
    "two_tu_shared": App(("two_tu_main.cu",), lib_sources=("two_tu_kernels.cu",), cudart="dynamic",
                         note="a kernel in the executable, two in its shared library"),
    "graph_params": App(("graph_params.cu",),
                        note="kernels as graph nodes: captured, added by hand, given new scalars by SetParams and by a graph update"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def make_compat_tree(out: Path, cuda: Path) -> tuple[Path, Path]:
    """The CUDA 13 fixes, proteus-clang++'s own, under out/compat/: (the --cuda-path tree, the
    directory of stand-in headers)."""
    compat = cc.compat_tree(cuda, out / "compat")
    return compat.root, compat.stubs


def _libcuda_stub(objdir: Path, host_obj: Path) -> Path:
    """A link-time stand-in for libcuda.so (the real one comes with the driver, at run time):
    every cu* function the object needs, with the real library's soname."""
    nm = subprocess.run(["nm", "-u", str(host_obj)], capture_output=True, text=True, check=True).stdout
    names = sorted({line.split()[-1] for line in nm.splitlines() if line.split()[-1].startswith("cu")})
    stub_dir = objdir / "stubs"
    stub_dir.mkdir(exist_ok=True)
    src = stub_dir / "libcuda_stub.c"
    src.write_text("".join(f"int {n}(void) {{ return 999; }}\n" for n in names))
    run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(stub_dir / "libcuda.so")])
    return stub_dir


def build_app(name: str, app: App, out: Path, args, tree: Path, stubs: Path, src: Path = SRC) -> str:
    """Build one app from `src` (default samples/src/) into `out`; bench/corpora/apps/build.py reuses this."""
    exe = out / name
    stamp = out / f".{name}.stamp"  # what the binary was built with: an --arch change rebuilds it
    config = f"{args.arch} {args.clang} {args.cuda_path} {' '.join(RECIPES[app.recipe])}\n"
    sources = [src / s for s in app.sources]
    # (driver_api.cpp does not use common.h; harmless)
    inputs = sources + [src / s for s in app.lib_sources] + [src / "common.h", Path(__file__)]
    if (exe.exists() and stamp.exists() and stamp.read_text() == config
            and exe.stat().st_mtime > max(p.stat().st_mtime for p in inputs)):
        return f"{name}: up to date"
    tmp = out / f".{name}.tmp"
    tmp.unlink(missing_ok=True)
    cuda = Path(args.cuda_path)
    archs = [args.arch] + [a for a in app.extra_archs if a != args.arch]
    libs = ["-L", str(cuda / "lib64"), "-Wl,-rpath," + str(cuda / "lib64")]
    libs += ["-lcudart"] if app.cudart == "dynamic" else ["-lcudart_static", "-ldl", "-lrt", "-lpthread"]
    if not app.pie:
        libs.append("-no-pie")

    if app.compiler == "nvcc":
        arch = list(app.nvcc_arch) or [f"-arch={args.arch}"]
        run([str(cuda / "bin" / "nvcc"), *arch, "-O3", *(["-rdc=true"] if app.rdc else []), "-I", str(src),
             *map(str, sources), "-o", str(tmp)])
    else:
        # CUDA 13 keeps cooperative_groups' dependencies (cuda/std/...) under include/cccl
        flags = ["-x", "cuda", f"--cuda-path={tree}", "-I", str(stubs), "-I", str(src), "-I", str(cuda / "include" / "cccl"),
                 "-O3", "-std=c++17", *RECIPES[app.recipe], "-Wno-unknown-cuda-version"]
        if app.compress:
            flags += ["-Xcuda-fatbinary", f"--compress-mode={app.compress}"]
        flags += [f"--cuda-gpu-arch={a}" for a in archs]
        if app.compiler == "driver":
            objdir = out / f".{name}.objs"
            objdir.mkdir(exist_ok=True)
            host_src, dev_src = sources
            cubin, fatbin = objdir / "kernels.cubin", objdir / "kernels.fatbin"
            run([args.clang, *flags, "--cuda-device-only", "-c", str(dev_src), "-o", str(cubin)])
            run([str(tree / "bin" / "fatbinary"), "-64", "--create", str(fatbin),
                 f"--image=profile={args.arch},file={cubin}"])
            asm = objdir / "fatbin.s"
            asm.write_text('.section .nv_fatbin,"a"\n.balign 8\n.globl proteus_sample_fatbin\n'
                           f'proteus_sample_fatbin:\n.incbin "{fatbin}"\n.section .note.GNU-stack,"",@progbits\n')
            host_obj = objdir / "host.o"
            run([args.clang, "-O2", "-I", str(cuda / "include"), "-c", str(host_src), "-o", str(host_obj)])
            stubs_dir = _libcuda_stub(objdir, host_obj)
            run([args.clang, str(host_obj), str(asm), "-L", str(stubs_dir), "-lcuda", "-o", str(tmp)])
        elif app.compiler == "mixed":
            objdir = out / f".{name}.objs"
            objdir.mkdir(exist_ok=True)
            *clang_srcs, nvcc_src = sources
            objs = []
            for s in clang_srcs:
                obj = objdir / (s.stem + ".o")
                run([args.clang, *flags, "-c", str(s), "-o", str(obj)])
                objs.append(str(obj))
            obj = objdir / (nvcc_src.stem + ".o")
            run([str(cuda / "bin" / "nvcc"), f"-arch={args.arch}", "-O3", "-I", str(src), "-c", str(nvcc_src), "-o", str(obj)])
            objs.append(str(obj))
            run([args.clang, *objs, *libs, "-o", str(tmp)])
        elif app.rdc:
            objdir = out / f".{name}.objs"
            objdir.mkdir(exist_ok=True)
            objs = []
            for s in sources:
                obj = objdir / (s.stem + ".o")
                run([args.clang, *flags, "-fgpu-rdc", "-c", str(s), "-o", str(obj)])
                objs.append(str(obj))
            dlink = objdir / "dlink.o"
            run([str(cuda / "bin" / "nvcc"), "-dlink", *[f"-arch={a}" for a in archs], *objs, "-o", str(dlink)])
            run([args.clang, *objs, str(dlink), *libs, "-o", str(tmp)])
        elif app.lib_sources:
            lib = out / f"lib{name}.so"
            run([args.clang, *flags, "-fPIC", "-shared", *[str(src / s) for s in app.lib_sources], *libs, "-o", str(lib)])
            cuda_srcs = [str(s) for s in sources if s.suffix == ".cu"]
            host = [*flags, *cuda_srcs, *libs] if cuda_srcs else ["-O2", *map(str, sources)]
            run([args.clang, *host, "-L", str(out), f"-l{name}", "-Wl,-rpath,$ORIGIN", "-o", str(tmp)])
        else:
            run([args.clang, *flags, *map(str, sources), *libs, "-o", str(tmp)])
    tmp.replace(exe)
    stamp.write_text(config)
    return f"{name}: built ({app.note})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("apps", nargs="*", help=f"apps to build (default: all): {', '.join(APPS)}")
    parser.add_argument("--out", default=str(HERE / "build"), help="output directory (default: samples/build)")
    parser.add_argument("--arch", default=os.environ.get("SAMPLES_ARCH", "sm_90"), help="GPU architecture (default: sm_90)")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang++-19"))
    parser.add_argument("--cuda-path", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--list", action="store_true", help="list the apps and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, app in APPS.items():
            print(f"{name:26} {app.note}")
        return 0
    unknown = [a for a in args.apps if a not in APPS]
    if unknown:
        parser.error(f"unknown app(s): {', '.join(unknown)}")
    out = Path(args.out).resolve()
    names = args.apps or list(APPS)
    for tool, hint in ((args.clang, "apt-get install clang-19 llvm-19 lld-19"),
                       (str(Path(args.cuda_path) / "bin" / "nvcc"), "install the CUDA toolkit or pass --cuda-path")):
        if shutil.which(tool) is None:
            # A GPU host has no clang: the samples are built elsewhere and copied with the tree.
            if all((out / n).exists() for n in names):
                log(f"samples/build.py: {tool} not found; using the {len(names)} apps already in {out}")
                return 0
            raise SystemExit(f"samples/build.py: {tool} not found ({hint})")

    out.mkdir(parents=True, exist_ok=True)
    tree, stubs = make_compat_tree(out, Path(args.cuda_path))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(lambda n: build_app(n, APPS[n], out, args, tree, stubs), names):
            log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
