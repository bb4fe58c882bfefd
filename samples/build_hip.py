#!/usr/bin/env python3
"""Build the HIP sample apps (samples/hip/) with clang-19, -fembed-bitcode and Debian's ROCm 5.2.

    python3 samples/build_hip.py                       # all apps, gfx90a + gfx940, into samples/build/hip/
    python3 samples/build_hip.py --arch gfx90a         # one architecture
    python3 samples/build_hip.py loop_count --out /tmp/hip

The apps are only built here, never run: no AMD GPU is available (docs/user/hip.md).

Why not one `clang++-19 -x hip -fembed-bitcode` command: with -fembed-bitcode, clang-19's driver
compiles device code in two cc1 steps (source -> bitcode, bitcode -> object) and leaves
`-target-cpu` out of the second, so the code object's ELF header names no GPU (e_flags 0;
its metadata says gfx700) and the HIP runtime would not match it to any device. So the
device side is built by hand, step for step as the driver does it but with the CPU named:

  1. clang++-19 --cuda-device-only -emit-llvm -c      source -> optimized bitcode, device libs linked
  2. clang-19 -cc1 -target-cpu gfxX -emit-obj -fembed-bitcode=all -disable-llvm-passes
                                                      bitcode -> object with .llvmbc/.llvmcmd
  3. ld.lld-19 -shared                                object -> code object
  4. clang-offload-bundler-19 [-compress]             code objects -> the offload bundle (CCOB)
  5. clang++-19 --cuda-host-only -fcuda-include-gpubinary   host object with .hip_fatbin

One app (`loop_count_driver`) is built with the plain one-command driver, to keep the
extractor honest about such binaries (it records them and warns).

ROCm 5.2's device libraries stop at gfx940 (there is no oclc_isa_version_942.bc), so gfx940
stands in for the MI300's gfx942.
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

# samples/build.py's helpers: beside this file, which is sys.path[0] when it runs as a script,
# and in the samples package when it is imported (`from samples import build_hip`).
if __package__:
    from .build import log, run
else:
    from build import log, run

HERE = Path(__file__).resolve().parent

SRC = HERE / "hip"
DEFAULT_ARCHS = ("gfx90a", "gfx940")
DEVICE_LIBS = "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"  # Debian's rocm-device-libs
HIP_VERSION = "5.2.21153"  # Debian 12's HIP (/usr/share/hip/version)


@dataclass(frozen=True)
class App:
    sources: tuple[str, ...]
    compress: bool = False  # clang-offload-bundler -compress: a CCOB (zstd) bundle
    code_object_version: int | None = None  # -mcode-object-version; None: clang-19's default (5)
    one_command: bool = False  # the plain driver command (its code objects name no GPU)
    module_api: bool = False  # host C++ on the module API + device code embedded as an offload bundle
    per_thread_stream: bool = False  # -fgpu-default-stream=per-thread: <<<>>> calls hipLaunchKernel_spt
    note: str = field(default="", compare=False)


APPS: dict[str, App] = {
    "loop_count": App(("loop_count.hip",), note="scalar trip counts; int, float, double, bool, 64-bit scalars"),
    "loop_count_ccob": App(("loop_count.hip",), compress=True, note="compressed offload bundle (CCOB, zstd)"),
    "loop_count_cov4": App(("loop_count.hip",), code_object_version=4, note="code object version 4 metadata"),
    "loop_count_spt": App(("loop_count.hip",), per_thread_stream=True,
                          note="per-thread default stream: launches through hipLaunchKernel_spt"),
    "loop_count_driver": App(("loop_count.hip",), one_command=True,
                             note="one clang++ -fembed-bitcode command: code objects without a target"),
    "templates": App(("templates.hip",), note="templates, struct by value, __launch_bounds__"),
    "device_globals": App(("device_globals.hip",), note="__device__ and __constant__ variables"),
    "two_tu": App(("two_tu_main.hip", "two_tu_kernels.hip"), note="two .hip files, two offload bundles"),
    "module_api": App(("module_api.cpp", "module_api_kernels.hip"), module_api=True,
                      note="module API: hipModuleLoadData of an offload bundle embedded in .hip_fatbin"),
}


def hip_flags(clang: str) -> list[str]:
    return ["-x", "hip", "--rocm-path=/usr", f"--hip-version={HIP_VERSION}", f"--hip-device-lib-path={DEVICE_LIBS}",
            "-I", str(SRC), "-O3", "-std=c++17", "-Wno-unused-result"]


def llvm_tool(clang: str, name: str) -> str:
    """clang-19's sibling tool (ld.lld-19, clang-offload-bundler-19)."""
    suffix = clang.rsplit("-", 1)[1] if "-" in os.path.basename(clang) else ""
    return f"{name}-{suffix}" if suffix.isdigit() else name


def build_device(src: Path, arch: str, app: App, objdir: Path, clang: str) -> Path:
    stem = objdir / f"{src.stem}-{arch}"
    cov = [f"-mcode-object-version={app.code_object_version}"] if app.code_object_version else []
    # Each translation unit needs its own -cuid, as the driver gives it (the driver drops -cuid
    # under --cuda-host-only, hence -Xclang): without it two units define the same __hip_cuid_.
    run([clang, *hip_flags(clang), *cov, "-Xclang", f"-cuid={src.stem}", "--cuda-device-only", "--no-gpu-bundle-output",
         f"--offload-arch={arch}", "-emit-llvm", "-c", str(src), "-o", f"{stem}.bc"])
    cc = clang.replace("clang++", "clang")
    run([cc, "-cc1", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", arch, "-emit-obj", "-fembed-bitcode=all",
         "-disable-llvm-passes", "-O3", "-mllvm", "-amdgpu-internalize-symbols", "-x", "ir", f"{stem}.bc",
         "-o", f"{stem}.o"])
    run([llvm_tool(clang, "ld.lld"), "-shared", "--no-undefined", f"{stem}.o", "-o", f"{stem}.co"])
    return Path(f"{stem}.co")


def bundle_device(src: Path, app: App, objdir: Path, args) -> Path:
    """The translation unit's code objects, one per architecture, in one offload bundle."""
    cos = [build_device(src, a, app, objdir, args.clang) for a in args.arch]
    fatbin = objdir / f"{src.stem}.hipfb"
    targets = ",".join(["host-x86_64-unknown-linux"] + [f"hipv4-amdgcn-amd-amdhsa--{a}" for a in args.arch])
    run([llvm_tool(args.clang, "clang-offload-bundler"), "-type=o", "-bundle-align=4096", f"-targets={targets}",
         "-input=/dev/null", *[f"-input={c}" for c in cos], f"-output={fatbin}",
         *(["-compress"] if app.compress else [])])
    return fatbin


def build_app(name: str, app: App, out: Path, args) -> str:
    exe = out / name
    stamp = out / f".{name}.stamp"
    config = f"{','.join(args.arch)} {args.clang}\n"
    sources = [SRC / s for s in app.sources]
    inputs = sources + [SRC / "common.h", Path(__file__)]
    if (exe.exists() and stamp.exists() and stamp.read_text() == config
            and exe.stat().st_mtime > max(p.stat().st_mtime for p in inputs)):
        return f"{name}: up to date"
    tmp = out / f".{name}.tmp"
    tmp.unlink(missing_ok=True)
    libs = ["-L/usr/lib/x86_64-linux-gnu", "-lamdhip64"]
    if app.module_api:
        objdir = out / f".{name}.objs"
        objdir.mkdir(exist_ok=True)
        host_src, dev_src = sources
        bundle = bundle_device(dev_src, app, objdir, args)
        # the bundle in the app's own .hip_fatbin section, where the extractor finds it
        asm = objdir / "bundle.s"
        asm.write_text('.section .hip_fatbin,"a",@progbits\n.p2align 12\n.globl proteus_sample_bundle\n'
                       f'proteus_sample_bundle:\n.incbin "{bundle}"\n.section .note.GNU-stack,"",@progbits\n')
        host_obj = objdir / "host.o"
        run([args.clang, "-D__HIP_PLATFORM_AMD__", "-O2", "-std=c++17", "-c", str(host_src), "-o", str(host_obj)])
        run([args.clang, str(host_obj), str(asm), *libs, "-o", str(tmp)])
    elif app.one_command:
        run([args.clang, *hip_flags(args.clang), "-fembed-bitcode", *[f"--offload-arch={a}" for a in args.arch],
             *map(str, sources), *libs, "-o", str(tmp)])
    else:
        objdir = out / f".{name}.objs"
        objdir.mkdir(exist_ok=True)
        objs = []
        for src in sources:
            fatbin = bundle_device(src, app, objdir, args)
            obj = objdir / f"{src.stem}.o"
            spt = ["-fgpu-default-stream=per-thread"] if app.per_thread_stream else []
            run([args.clang, *hip_flags(args.clang), *spt, "-Xclang", f"-cuid={src.stem}", "--cuda-host-only",
                 *[f"--offload-arch={a}" for a in args.arch], "-Xclang", "-fcuda-include-gpubinary", "-Xclang",
                 str(fatbin), "-c", str(src), "-o", str(obj)])
            objs.append(str(obj))
        run([args.clang, *objs, *libs, "-o", str(tmp)])
    tmp.replace(exe)
    stamp.write_text(config)
    return f"{name}: built ({app.note})"


def missing_tools(clang: str) -> list[str]:
    """What this build needs and cannot find (empty when it can run)."""
    missing = [t for t in (clang, llvm_tool(clang, "ld.lld"), llvm_tool(clang, "clang-offload-bundler"))
               if shutil.which(t) is None]
    if not os.path.exists("/usr/include/hip/hip_runtime.h"):
        missing.append("/usr/include/hip/hip_runtime.h (libamdhip64-dev)")
    if not os.path.exists(os.path.join(DEVICE_LIBS, "ockl.bc")):
        missing.append(f"{DEVICE_LIBS}/ockl.bc (rocm-device-libs)")
    return missing


def build_for_tests(clang: str = "clang++-19") -> tuple[str, str]:
    """Every app built (those up to date are kept) by this script in a child process, as the
    tests and the fuzz targets need them: ("ok", ""), ("missing", which tools are) or
    ("failed", the build's output)."""
    missing = missing_tools(clang)
    if missing:
        return "missing", f"HIP samples need {', '.join(missing)} (scripts/install-deps installs them)"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], capture_output=True, text=True)
    if proc.returncode != 0:
        return "failed", f"building the HIP samples failed:\n{proc.stdout}{proc.stderr}"
    return "ok", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("apps", nargs="*", help=f"apps to build (default: all): {', '.join(APPS)}")
    parser.add_argument("--out", default=str(HERE / "build" / "hip"), help="output directory (default: samples/build/hip)")
    parser.add_argument("--arch", action="append", help=f"offload architecture, repeatable (default: {' '.join(DEFAULT_ARCHS)})")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang++-19"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--list", action="store_true", help="list the apps and exit")
    args = parser.parse_args(argv)
    args.arch = args.arch or list(DEFAULT_ARCHS)

    if args.list:
        for name, app in APPS.items():
            print(f"{name:26} {app.note}")
        return 0
    unknown = [a for a in args.apps if a not in APPS]
    if unknown:
        parser.error(f"unknown app(s): {', '.join(unknown)}")
    out = Path(args.out).resolve()
    names = args.apps or list(APPS)
    missing = missing_tools(args.clang)
    if missing:
        if all((out / n).exists() for n in names):  # a GPU host: built elsewhere, copied with the tree
            log(f"samples/build_hip.py: missing {', '.join(missing)}; using the {len(names)} apps already in {out}")
            return 0
        raise SystemExit(f"samples/build_hip.py: missing {', '.join(missing)} "
                         "(apt-get install clang-19 lld-19 hipcc libamdhip64-dev rocm-device-libs)")
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(lambda n: build_app(n, APPS[n], out, args), names):
            log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
