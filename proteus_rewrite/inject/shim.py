"""libproteus.so: built once when the package is installed, copied beside each app's store.

The shim is generic: it finds the kernel stores (*.kstore) and `proteus-python.cfg` in its
own directory. That file names the Python that has proteus_rewrite installed (its shared
libpython, its home and its sys.path), so the shim can start it inside the app on the
first miss. It is written by `proteus-rewrite APP`, from the interpreter running it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from .. import import_path
from ..errors import InjectError

SHIM_NAME = "libproteus.so"
PYTHON_CFG = "proteus-python.cfg"
PACKAGED = Path(__file__).resolve().parent.parent / "_shim" / SHIM_NAME


# The shim's translation units (shim/shim.h says what each holds, and in which layer; the
# platform files are cuda*.c and hip.c); none needs CUDA or HIP headers.
SOURCES = ("tables.c", "python.c", "jobs.c", "trial.c", "check.c", "lifecycle.c", "cuda.c", "cuda_launch.c", "cuda_warm.c", "cuda_attrs.c",
           "cuda_capture.c", "cuda_graph.c", "cuda_validate.c", "hip.c", "nvtx.c")
HEADERS = ("shim.h", "platform.h", "tables.h", "hitpath.h", "protocol.h", "compare_ptx.h", "cuda_api.h", "hip_api.h", "nvtx3/nvToolsExt.h")


def source_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "shim"


def build(output: str | os.PathLike, shim_dir: str | os.PathLike | None = None, cc: str | None = None,
          flags: tuple[str, ...] = ()) -> Path:
    """Compile the shim (C, no CUDA or HIP headers needed) from `shim_dir` (default: the source
    tree's shim/) into `output`, atomically; `flags` go to the compiler after the defaults (a
    sanitizer build for bench/crash_hunt.py)."""
    src = Path(shim_dir) if shim_dir else source_dir()
    srcs = [src / name for name in SOURCES]
    missing = next((s for s in srcs + [src / h for h in HEADERS] if not s.is_file()), None)
    if missing is not None:
        raise InjectError("shim source not found (install from a source tree)", missing)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    fd, tmp = tempfile.mkstemp(prefix=".libproteus-", suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [compiler, "-std=gnu11", "-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", *flags, "-o", tmp,
           *map(str, srcs), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        first = next((line for line in lines if "error" in line), lines[0])  # not a warning before it
        raise InjectError(f"building the shim failed: {first}", src)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


def packaged_shim() -> Path:
    """The shim built at install time (pip install .); built here as a fallback in a source checkout."""
    if PACKAGED.is_file():
        return PACKAGED
    if (source_dir() / SOURCES[0]).is_file():
        return build(PACKAGED)
    raise InjectError("libproteus.so is missing from the installation; reinstall proteus-rewrite", PACKAGED)


def libpython() -> str:
    """The shared libpython of this interpreter (the one with proteus_rewrite installed)."""
    names = [sysconfig.get_config_var(v) for v in ("INSTSONAME", "LDLIBRARY")]
    dirs = [sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib"),
            os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("MULTIARCH") or "")]
    for d in filter(None, dirs):
        for n in names:
            if n and ".so" in n and os.path.isfile(os.path.join(d, n)):
                return os.path.join(d, n)
    raise InjectError(
        f"this Python ({sys.executable}) has no shared libpython (build it with --enable-shared, "
        "or run proteus-rewrite from one that has)"
    )


def python_config() -> str:
    lines = [f"libpython {libpython()}", f"home {sys.base_prefix}", f"executable {sys.executable}"]
    lines += [f"path {p}" for p in import_path()]
    return "\n".join(lines) + "\n"


def compile_package() -> None:
    """The package's modules as bytecode, for the shim's interpreter. It starts while the app
    starts, and a launch that comes first waits for it (a warm run's variant needs it). Where no
    .pyc was written (an editable install, or PYTHONDONTWRITEBYTECODE, which the embedded
    interpreter inherits from the app), every start compiles all of them from source, which
    more than doubles the start (docs/dev/findings/startup-and-exit.md). Only stale files are
    compiled; a package the user cannot write to keeps what its installer compiled."""
    import compileall
    compileall.compile_dir(str(Path(__file__).resolve().parents[1]), quiet=2)


def install(outdir: str | os.PathLike) -> Path:
    """Copy the shim into `outdir` with its proteus-python.cfg; returns the shim's path."""
    compile_package()
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    dst = out / SHIM_NAME
    cfg = python_config()
    for name, write in ((SHIM_NAME, lambda f: f.write(packaged_shim().read_bytes())), (PYTHON_CFG, lambda f: f.write(cfg.encode()))):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.chmod(tmp, 0o755 if name == SHIM_NAME else 0o644)
            os.replace(tmp, out / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return dst


if __name__ == "__main__":  # python -m proteus_rewrite.inject.shim [OUTPUT]: (re)build the packaged shim
    print(build(sys.argv[1] if len(sys.argv) > 1 else PACKAGED))
