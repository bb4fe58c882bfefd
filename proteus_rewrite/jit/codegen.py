"""Code generation: LLVM IR -> PTX (llvmlite's NVPTX backend) -> cubin; and for HIP,
LLVM IR -> AMDGPU object (llvmlite's AMDGPU backend) -> code object (ld.lld).

Code kinds are small classes rather than strings and flags. PTX becomes loadable code
through one of three compilers (PROTEUS_PTX_COMPILER; "auto", the default, is ptxas where a
toolkit's ptxas is found that the driver is not older than, else nvJitLink, else the driver
inside an app where nvJitLink cannot be loaded; specializer._resolve_compiler says why):
  nvjitlink  in-process, through cuda-bindings (libnvJitLink from the CUDA toolkit or the
             nvidia-nvjitlink wheel). About as quick as the driver's JIT and quicker than
             ptxas, and its cubin loads without any JIT on later runs
  ptxas      the toolkit's ptxas in a subprocess, compiling the PTX as a whole program (nvJitLink
             compiles it as relocatable code: longer SASS around calls and in loops, so slower
             variants); a few ms more per kernel, paid once, in the run that compiles
  driver     no offline step: the PTX goes to cuModuleLoadData, which JIT-compiles it
What each costs and makes: docs/dev/findings/ptx-compiler.md.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ..errors import SpecializeError

TRIPLE = "nvptx64-nvidia-cuda"
# PTX ISA version that each CUDA release introduced (the newest a compiler of that release reads).
PTX_ISA = {(12, 0): 80, (12, 1): 81, (12, 2): 82, (12, 3): 83, (12, 4): 84, (12, 5): 85, (12, 6): 85,
           (12, 7): 86, (12, 8): 87, (12, 9): 88, (13, 0): 90}
LLVM_MAX_PTX = 90  # newest PTX ISA the NVPTX backend of llvmlite 0.50 (LLVM 22) emits


@dataclass(frozen=True)
class PTX:
    text: str
    arch: int

    @property
    def data(self) -> bytes:
        return self.text.encode() + b"\0"


@dataclass(frozen=True)
class Cubin:
    data: bytes
    arch: int


@dataclass(frozen=True)
class CodeObject:
    """A loadable AMDGPU code object (what hipModuleLoadData takes)."""

    data: bytes
    arch: str  # gfx90a


Image = PTX | Cubin | CodeObject
AMDGPU_TRIPLE = "amdgcn-amd-amdhsa"
# Processors LLVM 21 dropped (folded into gfx942): LLVM 22's backend does not know them and
# crashes on code for them rather than failing, so they are refused before it sees any.
LLVM_REMOVED_PROCESSORS = {"gfx940": "gfx942", "gfx941": "gfx942"}
LLD_NAMES = ("ld.lld", "ld.lld-22", "ld.lld-21", "ld.lld-20", "ld.lld-19")
ROCM_LLD = "/opt/rocm/llvm/bin/ld.lld"


@functools.lru_cache(maxsize=None)
def target_machine(arch: int, ptx_isa: int, opt_level: int):
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=f"sm_{arch}", features=f"+ptx{ptx_isa}", opt=opt_level)


_fp_contraction: str | None = None  # what this process's NVPTX backend was set to (once: an LLVM option)


def fp_contraction(mode: str) -> None:
    """Make NVPTX code generation contract floating-point operations as the AOT compile did.

    clang compiles CUDA with -ffp-contract=fast, which its backend gets as AllowFPOpFusion =
    Fast: every mul/add pair may become an FMA, and the PTX leaves ptxas free to fuse too
    (`mul.f32`, not `mul.rn.f32`). llvmlite's target machines have the default, Standard:
    LLVM 22 then fused only what carries `contract` flags and wrote `.rn` on the rest (wsm5:
    66 mul.rn where the AOT PTX has 7), so a variant rounded differently from the code it
    replaces. The same switch exists as the NVPTX option -nvptx-fma-level, which LLVM reads
    per function; options can be set once per process, so the first module decides, and a
    module that asks for another mode is refused rather than compiled with the wrong one."""
    global _fp_contraction
    if _fp_contraction is None:
        if mode == "fast":
            import llvmlite.binding as llvm

            llvm.set_option("proteus", "-nvptx-fma-level=2")
        _fp_contraction = mode
    elif _fp_contraction != mode:
        raise SpecializeError(f"the module was compiled with -ffp-contract={mode}, and this compiler process already "
                              f"generates code for -ffp-contract={_fp_contraction} (an LLVM option, set once per process)")


def emit_ptx(module, tm, arch: int) -> PTX:
    try:
        return PTX(tm.emit_assembly(module), arch)
    except RuntimeError as exc:
        raise SpecializeError(f"PTX generation failed: {str(exc).strip().splitlines()[0]}") from None


NVJITLINK_DISTS = ("nvidia_nvjitlink", "nvidia_nvjitlink_cu13", "nvidia_nvjitlink_cu12")
NVJITLINK_SONAMES = ("libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so")


@dataclass(frozen=True)
class Library:
    """A shared library the compiler loads, found before it is loaded."""

    path: str
    version: str | None  # the wheel's; None for a toolkit's


_pinned_nvjitlink: str | None = None  # a compiler process's: its parent's choice (pin_nvjitlink)


@functools.lru_cache(maxsize=None)
def locate_nvjitlink() -> Library | None:
    """The libnvJitLink this process compiles with: an nvJitLink wheel's on sys.path, else the
    CUDA toolkit's; None where neither is found (the loader's own search is left to try).

    Found from sys.path, not from site-packages as cuda-pathfinder searches: the shim's
    interpreter and the compiler processes run without site handling (python -S), where
    site.getsitepackages() names the base Python's directories, not the venv's. The record of
    the wheel names the file, so nothing is guessed from the wheel's layout. Not
    importlib.metadata: importing it costs most of the shim's start on a warm run, and the cache
    key asks this on every process's warm path (docs/dev/findings/startup-and-exit.md)."""
    if _pinned_nvjitlink is not None:
        return Library(_pinned_nvjitlink, None)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not (name.endswith(".dist-info") and "-" in name):
                continue
            dist, version = name[: -len(".dist-info")].rsplit("-", 1)
            if dist.lower().replace("-", "_").replace(".", "_") not in NVJITLINK_DISTS:
                continue
            try:
                with open(os.path.join(entry, name, "RECORD")) as f:
                    files = [line.split(",", 1)[0] for line in f]
            except OSError:
                continue
            for rel in files:
                if os.path.basename(rel) in NVJITLINK_SONAMES and os.path.exists(os.path.join(entry, rel)):
                    return Library(os.path.join(entry, rel), version)
    cuda = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for d in ("lib64", "lib"):
        for soname in NVJITLINK_SONAMES:
            if os.path.exists(os.path.join(cuda, d, soname)):
                return Library(os.path.join(cuda, d, soname), None)
    return None


def pin_nvjitlink(path: str) -> None:
    """Use exactly this libnvJitLink (a compiler process: the one its parent located)."""
    global _pinned_nvjitlink
    _pinned_nvjitlink = path
    locate_nvjitlink.cache_clear()


def nvjitlink_available() -> bool:
    """Whether libnvJitLink is installed, without loading it: loading costs 100+ ms, and this
    is asked on the warm path."""
    return locate_nvjitlink() is not None


def loaded_nvjitlink() -> str | None:
    """The file of the libnvJitLink mapped into this process, if any (for the report)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libnvJitLink.so"):
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=None)
def compiler_identity(compiler: str) -> str:
    """Which compiler: it goes into every cache key, so it is computed on the warm path too."""
    if compiler == "nvjitlink":
        lib = locate_nvjitlink()
        return f"nvjitlink {lib.version}" if lib and lib.version else "nvjitlink (toolkit)"
    if compiler == "ptxas":
        return "ptxas {}.{}".format(*compiler_cuda_version("ptxas"))
    return compiler


@functools.lru_cache(maxsize=None)
def ptxas_usable(driver_version: int | None) -> bool:
    """Whether a toolkit's ptxas is found (PATH, else $CUDA_PATH/bin) and the driver (CUDA
    version as cuDriverGetVersion gives it; None offline) is not older than it: a newer
    compiler's cubin may not load. Asked once per process: a `ptxas --version` (a few ms)."""
    try:
        version = compiler_cuda_version("ptxas")
    except (SpecializeError, OSError):
        return False
    return driver_version is None or version <= (driver_version // 1000, (driver_version % 1000) // 10)


def driver_ptx_isa(driver_version: int) -> int:
    """The newest PTX ISA a driver of this version (e.g. 13000) reads."""
    return ptx_isa_for((driver_version // 1000, (driver_version % 1000) // 10))


def ptx_isa_for(cuda_version: tuple[int, int]) -> int:
    """The newest PTX ISA that a compiler or driver of this CUDA version reads, capped by LLVM."""
    known = [isa for ver, isa in PTX_ISA.items() if ver <= cuda_version]
    if not known:
        raise SpecializeError(f"CUDA {cuda_version[0]}.{cuda_version[1]} is too old (12.0 or newer is needed)")
    return min(max(known), LLVM_MAX_PTX)


@functools.lru_cache(maxsize=None)
def compiler_cuda_version(compiler: str) -> tuple[int, int]:
    """The CUDA version of the PTX compiler in use: what PTX ISA it accepts."""
    if compiler == "nvjitlink":
        return tuple(_nvjitlink().version())  # type: ignore[return-value]
    if compiler == "ptxas":
        out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release (\d+)\.(\d+)", out)
        if not m:
            raise SpecializeError(f"cannot read the version of {ptxas_path()}")
        return int(m.group(1)), int(m.group(2))
    if compiler == "driver":
        from cuda.bindings import driver

        try:
            driver.cuInit(0)
            err, v = driver.cuDriverGetVersion()
        except Exception as exc:  # libcuda.so itself is missing: no driver on this machine
            raise SpecializeError(f"no CUDA driver: {str(exc).splitlines()[0]}") from None
        if err != driver.CUresult.CUDA_SUCCESS:
            raise SpecializeError(f"cuDriverGetVersion failed: {err.name}")
        return v // 1000, (v % 1000) // 10
    raise SpecializeError(f"unknown PTX compiler {compiler!r}")


def compile_ptx(ptx: PTX, compiler: str, opt_level: int = 3) -> Image:
    if compiler == "driver":
        return ptx
    if compiler == "nvjitlink":
        return Cubin(_nvjitlink_compile(ptx, opt_level), ptx.arch)
    if compiler == "ptxas":
        return Cubin(_ptxas_compile(ptx, opt_level), ptx.arch)
    raise SpecializeError(f"unknown PTX compiler {compiler!r}")


@functools.lru_cache(maxsize=None)
def _nvjitlink():
    """cuda.bindings' nvJitLink, bound to the library locate_nvjitlink() found: loaded here by
    its path first, so that cuda-pathfinder, which looks for an already loaded copy before it
    searches, takes that one."""
    lib = locate_nvjitlink()
    if lib is not None:
        import ctypes

        try:
            ctypes.CDLL(lib.path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError as exc:
            raise SpecializeError(f"nvJitLink is not usable: {lib.path}: {exc}") from None
    try:
        from cuda.bindings import nvjitlink
    except ImportError:
        raise SpecializeError("cuda-bindings is not installed (pip install cuda-bindings)") from None
    return nvjitlink


def nvjitlink_options(arch: int, opt_level: int) -> list[str]:
    """nvJitLink's own -O takes 0 or 3 only (ERROR_UNRECOGNIZED_OPTION otherwise: upstream's
    tests/gpu/tuned_config.json asks CodeGenOptLevel 2); levels 1 and 2 go to its ptxas."""
    opts = [f"-arch=sm_{arch}", "-O0" if opt_level == 0 else "-O3"]
    return opts + ([f"-Xptxas=-O{opt_level}"] if opt_level in (1, 2) else [])


def _nvjitlink_compile(ptx: PTX, opt_level: int) -> bytes:
    nvjitlink = _nvjitlink()
    opts = nvjitlink_options(ptx.arch, opt_level)
    try:
        handle = nvjitlink.create(len(opts), opts)
    except Exception as exc:  # library not found, or an incompatible one
        raise SpecializeError(f"nvJitLink is not usable: {str(exc).splitlines()[0]}") from None
    try:
        data = ptx.data
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "jit.ptx")
        nvjitlink.complete(handle)
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    except nvjitlink.nvJitLinkError as exc:
        log = ""
        try:
            size = nvjitlink.get_error_log_size(handle)
            buf = bytearray(size)
            nvjitlink.get_error_log(handle, buf)
            log = buf.rstrip(b"\0").decode(errors="replace").strip()
        except Exception:
            pass
        raise SpecializeError(f"nvJitLink failed: {exc}{': ' + log.splitlines()[0] if log else ''}") from None
    finally:
        nvjitlink.destroy(handle)


def ptxas_path() -> str:
    found = shutil.which("ptxas") or os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", "ptxas")
    if not os.access(found, os.X_OK):
        raise SpecializeError("ptxas not found (put the CUDA toolkit's bin/ on PATH or set CUDA_PATH)")
    return found


def _ptxas_compile(ptx: PTX, opt_level: int) -> bytes:
    with tempfile.TemporaryDirectory(prefix="proteus-ptxas-") as tmp:
        src, dst = os.path.join(tmp, "jit.ptx"), os.path.join(tmp, "jit.cubin")
        with open(src, "w") as f:
            f.write(ptx.text)
        proc = subprocess.run([ptxas_path(), f"-arch=sm_{ptx.arch}", f"-O{opt_level}", src, "-o", dst],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise SpecializeError(f"ptxas failed: {first}")
        with open(dst, "rb") as f:
            return f.read()


@functools.lru_cache(maxsize=None)
def amdgpu_target_machine(arch: str, opt_level: int):
    """A target machine for one AMDGPU processor (e.g. gfx90a). llvmlite 0.50's LLVM 22
    knows processors newer than the recorded bitcode's clang-19, so any arch LLVM 22 takes works."""
    import llvmlite.binding as llvm

    if arch in LLVM_REMOVED_PROCESSORS:
        raise SpecializeError(f"{arch} is not a processor llvmlite's LLVM 22 knows (LLVM 21 replaced it by "
                              f"{LLVM_REMOVED_PROCESSORS[arch]}): build the app for {LLVM_REMOVED_PROCESSORS[arch]}")
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple(AMDGPU_TRIPLE)
    return target.create_target_machine(cpu=arch, opt=opt_level, reloc="pic")


def emit_amdgpu_object(module, tm) -> bytes:
    """A relocatable AMDGPU ELF object: kernels, their descriptors and the metadata note."""
    try:
        return tm.emit_object(module)
    except RuntimeError as exc:
        raise SpecializeError(f"AMDGPU code generation failed: {str(exc).strip().splitlines()[0]}") from None


def lld_path() -> str:
    """ld.lld, which turns the object into a code object (a shared ELF the HIP runtime loads):
    LLVM's own or ROCm's, any version that links AMDGPU objects."""
    for name in LLD_NAMES:
        found = shutil.which(name)
        if found:
            return found
    if os.access(ROCM_LLD, os.X_OK):
        return ROCM_LLD
    raise SpecializeError("ld.lld not found (apt-get install lld-19, or ROCm's llvm/bin on PATH)")


def link_code_object(obj: bytes, arch: str) -> CodeObject:
    with tempfile.TemporaryDirectory(prefix="proteus-lld-") as tmp:
        src, dst = os.path.join(tmp, "jit.o"), os.path.join(tmp, "jit.co")
        with open(src, "wb") as f:
            f.write(obj)
        proc = subprocess.run([lld_path(), "-flavor", "gnu", "-m", "elf64_amdgpu", "--no-undefined", "-shared",
                               src, "-o", dst], capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise SpecializeError(f"ld.lld failed: {first}")
        with open(dst, "rb") as f:
            return CodeObject(f.read(), arch)
