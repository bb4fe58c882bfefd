"""The shim's layers (docs/dev/architecture.md, shim/platform.h): the core serves both GPU
platforms and calls them only through the `gpu` table each one fills, and only python.c calls
Python.

    layer 0  tables.c, nvtx.c           the tables, hashing, counters, clocks; NVTX ranges
    layer 1  python.c                   the embedded interpreter: every call into Python
    layer 2  trial.c, check.c           speed trials (events through the table); a new variant's check
    layer 3  jobs.c, lifecycle.c        the miss path and compile threads; start-up, exit, report
    layer 4  cuda*.c | hip.c            the platforms, each filling `struct gpu_ops`

A file may use what a file of its own layer or a lower one defines, never a higher one's, and
neither platform uses the other's. The names a file uses are read from its object file (nm), so
a call, a variable and a function pointer all count. The headers of the core (shim.h,
platform.h, tables.h, hitpath.h) are checked by name: they declare no platform's function."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from proteus_rewrite.inject import shim

SHIM = Path(__file__).resolve().parents[2] / "shim"

CORE = ("shim.h", "platform.h", "tables.h", "hitpath.h", "tables.c", "nvtx.c", "python.c", "trial.c", "check.c", "jobs.c",
        "lifecycle.c")
LAYERS = {"tables.c": 0, "nvtx.c": 0, "python.c": 1, "trial.c": 2, "check.c": 2, "jobs.c": 3, "lifecycle.c": 3}
PLATFORM = 4

# A driver or runtime function: cuLaunchKernel, cudaLaunchKernel, hipModuleLoadData,
# __cudaRegisterFunction, __hipRegisterVar, and the shim's pointers to the real ones.
PLATFORM_NAME = re.compile(r"\b(?:cu[A-Z]\w*|cuda[A-Z]\w*|hip[A-Z]\w*|__cuda\w+|__hip\w+|real_(?:cu|hip)\w*)")
PYTHON_NAME = re.compile(r"\b(?:py\.\w+|_?Py[A-Z_]\w*)")


def code_only(src: str) -> str:
    """src with its comments and string and character literals blanked: what the compiler reads
    as names. (A comment may name the driver function whose behaviour it explains.)"""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            end = src.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif src.startswith("//", i):
            end = src.find("\n", i)
            end = n if end < 0 else end
        elif src[i] in "\"'":
            end = i + 1
            while end < n and src[end] != src[i] and src[end] != "\n":
                end += 2 if src[end] == "\\" else 1
            end += 1
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", src[i:end]))
        i = end
    return "".join(out)


def test_code_only_keeps_code_and_blanks_the_rest():
    src = 'f(); /* cuInit */ g("hipFoo", \'"\'); // cuX\nh(); /* two\nlines */ k();'
    code = code_only(src)
    assert len(code) == len(src) and code.count("\n") == 2
    assert code.split() == ["f();", "g(", ",", ");", "h();", "k();"]


@pytest.mark.parametrize("name", CORE)
def test_the_core_names_no_platform_function(name):
    code = code_only((SHIM / name).read_text())
    found = sorted(set(PLATFORM_NAME.findall(code)))
    assert not found, f"shim/{name} is core: it reaches CUDA or HIP only through `gpu` (shim/platform.h), not {found}"
    includes = re.findall(r'#\s*include\s*"((?:cuda|hip)\w*\.h)"', code + (SHIM / name).read_text())
    assert not includes, f"shim/{name} is core: it includes {includes}"


@pytest.mark.parametrize("name", sorted(p.name for p in [*SHIM.glob("*.c"), *SHIM.glob("*.h")]))
def test_only_python_c_calls_python(name):
    if name == "python.c":
        return
    found = sorted(set(PYTHON_NAME.findall(code_only((SHIM / name).read_text()))))
    assert not found, f"shim/{name} calls Python ({found}): only python.c does, through its typed py_* functions"


def test_every_source_has_a_layer():
    assert {p.name for p in SHIM.glob("*.c")} == set(shim.SOURCES)
    unplaced = [n for n in shim.SOURCES if n not in LAYERS and not n.startswith(("cuda", "hip"))]
    assert not unplaced, f"give {unplaced} a layer here (and a place in docs/dev/architecture.md)"


def layer(name: str) -> int:
    return LAYERS.get(name, PLATFORM)


def platform_of(name: str) -> str | None:
    return "hip" if name.startswith("hip") else "cuda" if name.startswith("cuda") else None


@pytest.fixture(scope="module")
def symbols(tmp_path_factory) -> dict[str, tuple[set[str], set[str]]]:
    """file -> (the global names its object defines, the names it uses undefined)."""
    if not shutil.which("cc") or not shutil.which("nm"):
        pytest.skip("needs cc and nm")
    tmp = tmp_path_factory.mktemp("layers")
    out = {}
    for name in shim.SOURCES:
        obj = tmp / (name + ".o")
        proc = subprocess.run(["cc", "-std=gnu11", "-O0", "-w", "-fPIC", "-I", str(SHIM), "-c", str(SHIM / name), "-o", str(obj)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        defined, used = set(), set()
        for line in subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                used.add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRCVW":
                defined.add(parts[2])
        out[name] = (defined, used)
    return out


# The C library's functions the shim interposes (cuda.c, lifecycle.c): any file may call them,
# and in the process they are the shim's own (NVTX's loader calls dlsym, for one).
INTERPOSED_LIBC = {"dlsym", "exit", "__libc_start_main"}


def test_no_file_uses_a_higher_layer_or_the_other_platform(symbols):
    owner = {sym: name for name, (defined, _) in symbols.items() for sym in defined if sym not in INTERPOSED_LIBC}
    wrong = []
    for name, (_, used) in symbols.items():
        for sym in sorted(used):
            other = owner.get(sym)
            if other is None or other == name:
                continue
            if layer(other) > layer(name):
                wrong.append(f"{name} (layer {layer(name)}) uses {sym} of {other} (layer {layer(other)})")
            elif platform_of(name) and platform_of(other) and platform_of(name) != platform_of(other):
                wrong.append(f"{name} uses {sym} of {other}: one platform never reaches into the other")
    assert not wrong, "\n".join(wrong)
