"""proteus-clang++: clang++ with the build recipe and what clang 19 needs to build against
CUDA 13, for use as CXX or CMAKE_CUDA_COMPILER (it wraps clang as ccache and hipcc do).

    proteus-clang++ -O3 app.cu -o app

What it adds (docs/user/build.md), each only where the command needs it, and before the user's
flags so that those win (`-ffp-contract=fast` given by the user stays in force):
  CUDA compile      -Xclang -fembed-bitcode=all -ffp-contract=on, --cuda-gpu-arch=$PROTEUS_CUDA_ARCH
                    (default sm_90) unless an architecture is given, and the CUDA 13 pieces:
                    --cuda-path=<compat tree> -isystem <stub headers> -isystem $CUDA/include/cccl
                    -Wno-unknown-cuda-version
  CUDA -E / -M      the CUDA 13 pieces and the architecture (the headers must be found)
  link with GPU     -lcudart_static -ldl -lrt -lpthread (unless a cudart is linked already) and
  code              -L$CUDA/lib64 (+ lib64/stubs), after the user's own -L
Anything else (a plain C++ file, --version, no input) goes to clang unchanged.

The compat tree is made from this package on first use, per user and per toolkit, under the
user cache directory: the toolkit's entries as symlinks, except bin/fatbinary, a shell script
that rewrites clang 19's `--image=profile=sm_90,file=X` as CUDA 13's
`--image3=kind=elf,sm=90,file=X` (compute_90: kind=ptx) and runs the real one. The stub
headers stand in for headers clang's CUDA wrapper includes that the toolkit lacks.

Environment: CUDA_PATH (the toolkit, default /usr/local/cuda), PROTEUS_CLANG (the clang++ to
run, default clang++-19, else clang++ if 19 or newer), PROTEUS_CUDA_ARCH (e.g. sm_80; a comma
list gives several). `--proteus-show` prints the command instead of running it. The wrapper's
own errors are one line and exit with code 2; otherwise the exit code is clang's.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .fatbin.recipe import RECOMMENDED_FLAGS

PROG = "proteus-clang++"
EXIT_SETUP = 2  # the wrapper could not run clang: no clang 19, no CUDA toolkit
DEFAULT_ARCH = "sm_90"
FP_CONTRACT = "-ffp-contract=on"  # identical floating-point results under the tool (build.md)
CUDART = ("-lcudart_static", "-ldl", "-lrt", "-lpthread")
# Headers clang 19's CUDA wrapper (__clang_cuda_runtime_wrapper.h) includes: CUDA 13 dropped the
# first, the second is absent without cuRAND. Only the ones missing from the toolkit get a stand-in.
STUB_HEADERS = ("texture_fetch_functions.h", "texture_indirect_functions.h", "curand_mtgp32_kernel.h")
MARKER = ".proteus-compat"  # in a compat tree: the real toolkit's path

FATBINARY_WRAPPER = """#!/bin/sh
# proteus-rewrite's compat tree: clang 19 gives fatbinary its pre-CUDA-13 image option,
# which CUDA 13's fatbinary rejects ("Unknown option '-image'"); other arguments pass unchanged.
n=$#
for a do
  case $a in
    --image=profile=sm_*,file=*)
      r=${a#--image=profile=sm_}; a="--image3=kind=elf,sm=${r%%,file=*},file=${r#*,file=}" ;;
    --image=profile=compute_*,file=*)
      r=${a#--image=profile=compute_}; a="--image3=kind=ptx,sm=${r%%,file=*},file=${r#*,file=}" ;;
  esac
  set -- "$@" "$a"
done
shift "$n"
exec REAL "$@"
"""

# options whose value is the next argument: that argument is no input file
_SEPARATE = frozenset("""-o -x -I -L -l -D -U -include -imacros -isystem -idirafter -iquote -iprefix
    -iwithprefix -iwithprefixbefore -isysroot --sysroot -MF -MT -MQ -MJ -Xclang -Xlinker -Xassembler
    -Xpreprocessor -Xcuda-ptxas -Xcuda-fatbinary -Xarch_device -Xarch_host -Xoffload-linker
    -Xopenmp-target -mllvm -target -arch -z -u -T -B -F -cxx-isystem -ivfsoverlay -include-pch
    -serialize-diagnostics -dependency-file -dependency-dot --param -A""".split())
_INFO = frozenset({"--version", "-dumpversion", "-dumpmachine", "--help", "-help", "--help-hidden"})
_NO_LINK = frozenset({"-c", "-S", "-E", "-M", "-MM", "-fsyntax-only", "--precompile", "--cuda-device-only"})
_PREPROCESS = frozenset({"-E", "-M", "-MM"})
_SOURCE = frozenset(".c .cc .cp .cpp .cxx .c++ .C .CC .CPP .i .ii .m .mm .s .S .cu .cui .h .hh .hpp".split())
# libraries of the toolkit's lib64: a link that names one needs its -L
_CUDA_LIBS = re.compile(r"cuda|cudart.*|cudadevrt|cublas.*|cufft.*|curand.*|cusparse.*|cusolver.*|nvrtc.*|"
                        r"nvJitLink.*|nvptxcompiler.*|npp.*|nvjpeg.*|cupti|culibos")
_SHARED = re.compile(r"\.so(\.[0-9]+)*$")
_GPU_SECTIONS = re.compile(rb"\.nv_fatbin\0|__nv_relfatbin\0|\.nvFatBinSegment\0")


class SetupError(Exception):
    """What keeps the wrapper from running clang: one line, naming the fix."""


@dataclass(frozen=True)
class Compat:
    cuda: Path  # the real toolkit
    root: Path  # the toolkit tree to pass as --cuda-path
    stubs: Path  # the stand-in headers

    def compile_flags(self) -> list[str]:
        # -isystem, as nvcc's own profile does for cccl: a user's -I (a newer CCCL) comes first
        return [f"--cuda-path={self.root}", "-isystem", str(self.stubs),
                "-isystem", str(self.cuda / "include" / "cccl"), "-Wno-unknown-cuda-version"]

    def link_dirs(self) -> list[str]:
        # as nvcc links: lib64/stubs holds a libcuda.so for machines without the driver
        lib = self.cuda / "lib64"
        return [f"-L{d}" for d in (lib, lib / "stubs") if d.is_dir()]


# ------------------------------------------------------------------ the toolkit and its compat tree

def find_cuda(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Path:
    """The real toolkit: `path` (a --cuda-path, perhaps a compat tree), else CUDA_PATH, else
    /usr/local/cuda."""
    env = os.environ if env is None else env
    if path:
        cuda, where, fix = Path(path), "given with --cuda-path", "fix --cuda-path"
    elif env.get("CUDA_PATH"):
        cuda, where, fix = Path(env["CUDA_PATH"]), "CUDA_PATH", "fix CUDA_PATH"
    else:
        cuda, where, fix = Path("/usr/local/cuda"), "the default", "set CUDA_PATH to the toolkit's directory"
    if not (cuda / "include" / "cuda_runtime.h").is_file():
        raise SetupError(f"no CUDA toolkit at {cuda} ({where}: no include/cuda_runtime.h); {fix}")
    marker = cuda / MARKER
    return Path(marker.read_text().strip()) if marker.is_file() else cuda


def cuda_major(cuda: Path) -> int:
    text = (cuda / "include" / "cuda.h").read_text(errors="replace") if (cuda / "include" / "cuda.h").is_file() else ""
    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
    return int(m.group(1)) // 1000 if m else 0


def default_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("proteus-rewrite")) / "compat"


def compat_tree(cuda: str | os.PathLike, cache: str | os.PathLike | None = None) -> Compat:
    """The compat tree for `cuda`, made on first use under `cache` (default: the user cache).
    Its directory is named by the toolkit, this package's version and the tree's own contents,
    and is made in a temporary directory and renamed into place, so that builds running in
    parallel (make -j) each see either no tree or a complete one."""
    cuda = Path(cuda).resolve()
    translate = cuda_major(cuda) >= 13  # an older fatbinary may lack --image3; it needs no help
    stubs = tuple(h for h in STUB_HEADERS if not (cuda / "include" / h).exists())
    key = hashlib.sha256("\0".join([str(cuda), __version__, FATBINARY_WRAPPER if translate else "",
                                    *stubs, *_listing(cuda), *_listing(cuda / "bin")]).encode()).hexdigest()[:16]
    base = Path(cache) if cache else default_cache()
    final = base / key
    if not (final / "cuda" / MARKER).is_file():
        try:
            base.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=base))
        except OSError as e:
            raise SetupError(f"cannot make the CUDA compat tree under {base}: {e.strerror}; "
                             "set XDG_CACHE_HOME to a writable directory") from None
        try:
            _populate(tmp, cuda, translate, stubs)
            try:
                tmp.rename(final)
            except OSError:
                if not (final / "cuda" / MARKER).is_file():  # not another build's finished tree
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return Compat(cuda, final / "cuda", final / "stubs")


def _listing(d: Path) -> list[str]:
    return sorted(os.listdir(d)) if d.is_dir() else []


def _populate(out: Path, cuda: Path, translate: bool, stubs: tuple[str, ...]) -> None:
    (out / "stubs").mkdir()
    for name in stubs:
        (out / "stubs" / name).write_text(f"/* empty stand-in for {name}, which {cuda} lacks */\n")
    tree = out / "cuda"
    (tree / "bin").mkdir(parents=True)
    for entry in _listing(cuda):
        if entry != "bin":
            (tree / entry).symlink_to(cuda / entry)
    # nvcc and nvcc.profile come along: CMake finds the toolkit through `nvcc` under --cuda-path
    for entry in _listing(cuda / "bin"):
        if not (entry == "fatbinary" and translate):
            (tree / "bin" / entry).symlink_to(cuda / "bin" / entry)
    if translate:
        wrapper = tree / "bin" / "fatbinary"
        wrapper.write_text(FATBINARY_WRAPPER.replace("REAL", shlex.quote(str(cuda / "bin" / "fatbinary"))))
        wrapper.chmod(0o755)
    (tree / MARKER).write_text(f"{cuda}\n")


# ------------------------------------------------------------------ clang

def find_clang(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    given = env.get("PROTEUS_CLANG")
    if given:
        if shutil.which(given) is None:
            raise SetupError(f"PROTEUS_CLANG={given} is not an executable; fix PROTEUS_CLANG")
        return given
    if shutil.which("clang++-19"):
        return "clang++-19"
    if shutil.which("clang++"):
        out = subprocess.run(["clang++", "--version"], capture_output=True, text=True).stdout
        m = re.search(r"clang version (\d+)", out)
        if m and int(m.group(1)) >= 19:
            return "clang++"
        found = f"clang++ is version {m.group(1)}" if m else "clang++ gave no version"
    else:
        found = "no clang++"
    raise SetupError(f"no clang 19 or newer: no clang++-19 on PATH and {found}; "
                     "install clang-19 or set PROTEUS_CLANG")


# ------------------------------------------------------------------ the command line

@dataclass
class Command:
    """What a clang command line does, as far as the wrapper cares."""
    inputs: list[tuple[str, str]]  # (path, language: "cuda", "source" or "object")
    link: bool
    preprocess: bool
    info: bool  # asks clang about itself: no compile, nothing to add
    arch_given: bool
    bitcode_given: bool
    cudart_given: bool
    cuda_libs: bool  # links a library of the toolkit
    cuda_path: str | None  # the user's --cuda-path
    libs: list[str]  # -l names

    @property
    def cuda_inputs(self) -> bool:
        return any(lang == "cuda" for _, lang in self.inputs)


def parse(args: list[str]) -> Command:
    flat = _expand_response_files(args)
    inputs, libs = [], []
    lang = None
    link, preprocess, info = True, False, False
    arch = bitcode = False
    cuda_path = None
    i = 0
    while i < len(flat):
        a = flat[i]
        value = flat[i + 1] if a in _SEPARATE and i + 1 < len(flat) else None
        i += 2 if value is not None else 1
        if a in _NO_LINK:
            link = False
        if a in _PREPROCESS:
            preprocess = True
        if a in _INFO or a.startswith(("-print-", "--print-")):
            info = True
        if a == "-x" or (a.startswith("-x") and value is None and len(a) > 2 and not a.startswith("-X")):
            lang = value if a == "-x" else a[2:]
            lang = None if lang == "none" else lang
        elif a.startswith(("--cuda-gpu-arch=", "--offload-arch=", "--no-offload-arch=")):
            arch = True
        elif a.startswith("--cuda-path="):
            cuda_path = a.split("=", 1)[1]
        elif a.startswith("-fembed-bitcode") or (a == "-Xclang" and (value or "").startswith("-fembed-bitcode")):
            bitcode = True
        elif a == "-l" or a.startswith("-l"):
            libs.append(value if a == "-l" else a[2:])
        elif a == "-" or not a.startswith("-"):
            if a.startswith("@"):
                continue
            inputs.append((a, _language(a, lang)))
    cudart = any(name.startswith("cudart") for name in libs) or any(
        Path(p).name.startswith("libcudart") for p, kind in inputs if kind == "object")
    cuda_libs = cudart or any(_CUDA_LIBS.fullmatch(name) for name in libs)
    if not inputs:
        info = True
    return Command(inputs, link and not info, preprocess, info, arch, bitcode, cudart, cuda_libs, cuda_path, libs)


def _language(path: str, lang: str | None) -> str:
    if lang is not None:
        return "cuda" if lang == "cuda" else "source"
    suffix = Path(path).suffix
    if suffix == ".cu":
        return "cuda"
    return "source" if suffix in _SOURCE or path == "-" else "object"


def _expand_response_files(args: list[str]) -> list[str]:
    """The arguments with each readable @file's contents in its place, for reading only: clang
    still gets the @file."""
    out = []
    for a in args:
        if a.startswith("@") and os.path.isfile(a[1:]):
            try:
                out += shlex.split(Path(a[1:]).read_text())
                continue
            except (OSError, ValueError):
                pass
        out.append(a)
    return out


def has_gpu_code(path: str) -> bool:
    """An object or archive with a fat binary from clang or nvcc (their section names)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _GPU_SECTIONS.search(data) is not None
    except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
        return False


def arch_flags(env: dict[str, str]) -> list[str]:
    archs = [a.strip() for a in (env.get("PROTEUS_CUDA_ARCH") or DEFAULT_ARCH).split(",") if a.strip()]
    return [f"--cuda-gpu-arch={'sm_' + a if re.fullmatch(r'[0-9]+[a-z]?', a) else a}" for a in archs]


def rewrite(args: list[str], env: dict[str, str] | None = None, compat=None) -> list[str]:
    """The arguments to give clang for `args` (without clang's own name). `compat(cuda_path)`
    gives the Compat for a toolkit path (None: CUDA_PATH or /usr/local/cuda); it is only asked
    when the command compiles or links CUDA."""
    env = os.environ if env is None else env
    compat = compat or (lambda path: compat_tree(find_cuda(path, env)))
    cmd = parse(args)
    if cmd.info:
        return list(args)
    # a shared library with GPU code brings its own runtime: only objects and archives count
    gpu_link = cmd.link and (cmd.cuda_inputs or any(lang == "object" and not _SHARED.search(p) and has_gpu_code(p)
                                                    for p, lang in cmd.inputs))
    if not (cmd.cuda_inputs or gpu_link or (cmd.link and cmd.cuda_libs)):
        return list(args)
    c = compat(cmd.cuda_path)
    user = [a for a in args if not a.startswith("--cuda-path=")] if cmd.cuda_path else list(args)
    before, after = [], []
    if cmd.cuda_inputs:
        before += c.compile_flags()
        if not cmd.preprocess:
            before += [] if cmd.bitcode_given else [*RECOMMENDED_FLAGS]
            before.append(FP_CONTRACT)
        before += [] if cmd.arch_given else arch_flags(env)
    if cmd.link:
        after += c.link_dirs()
        if gpu_link and not cmd.cudart_given:
            after += CUDART
    return before + user + after


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show = "--proteus-show" in args
    args = [a for a in args if a != "--proteus-show"]
    try:
        clang = find_clang()
        full = [clang, *rewrite(args)]
    except SetupError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_SETUP
    if show:
        print(shlex.join(full))
        return 0
    try:
        os.execvp(clang, full)
    except OSError as e:
        print(f"{PROG}: error: cannot run {clang}: {e.strerror}", file=sys.stderr)
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
