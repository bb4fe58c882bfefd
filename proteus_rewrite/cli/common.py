"""What the commands share: reading an app or a store, finding a kernel, parsing launch values,
printing a kernel table."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import __version__, store
from ..errors import InputError, NoBitcodeError, ProteusError, StoreError
from ..fatbin import kernels as kernels_mod
from ..fatbin.kernels import KernelTable
from ..fatbin.table import arch_name
from ..jit.targets import best_record, target_for
from .app import err_console


def input_path() -> click.Path:
    """The type of an input file's argument: the command reads it itself, so that a missing,
    unreadable or wrong kind of file is one line and exit 3 (InputError), not click's usage error."""
    return click.Path(path_type=str, readable=False)


def cache_dir_path() -> click.Path:
    """The type of --dir / --cache-dir: the cache itself says what is wrong with one (CacheError),
    whether it came from the option or from PROTEUS_CACHE_DIR."""
    return click.Path(path_type=str, readable=False)


def require_file(path: str) -> None:
    """An InputError unless `path` is a file this process can read (for a command that only
    hands it on, as validate does to the app it runs)."""
    if os.path.isdir(path):
        raise InputError("is a directory, not an executable", path)
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


def store_paths(path: str) -> list[str]:
    """Every .kstore of a directory written by proteus-rewrite (the app's, and one per shared
    library with kernels), or the one store or app named."""
    if os.path.isdir(path):
        found = sorted(str(p) for p in Path(path).glob(f"*{store.SUFFIX}"))
        if not found:
            raise StoreError(f"no {store.SUFFIX} file in the directory (not written by proteus-rewrite?)", path)
        return found
    return [path]


def store_path(path: str) -> str:
    """A directory written by proteus-rewrite stands for the .kstore inside it."""
    if os.path.isdir(path):
        found = sorted(Path(path).glob(f"*{store.SUFFIX}"))
        if len(found) != 1:
            raise StoreError(f"expected one {store.SUFFIX} file in the directory, found {len(found)}", path)
        return str(found[0])
    return path



def arch(text: str) -> int | str:
    """sm_90 -> 90 (CUDA); gfx90a -> "gfx90a" (HIP: an AMDGPU processor, features dropped)."""
    t = text.lower()
    if t.startswith("gfx") and t[3:].split(":", 1)[0].isalnum():
        return t.split(":", 1)[0]
    t = t.removeprefix("sm_").removeprefix("sm")
    if not t.isdigit():
        raise click.BadParameter(f"{text!r}: expected sm_XX (e.g. sm_90) or an AMDGPU processor (e.g. gfx90a)",
                                 param_hint="--arch")
    return int(t)


def default_arch(table: KernelTable, name: str) -> str:
    """A HIP kernel's first processor with bitcode (each is built for a few; none is 'newest')."""
    archs = [k.arch for k in matching(table, name) if k.specializable]
    return str(archs[0]) if archs else "gfx90a"


def dim3(text: str, hint: str) -> tuple[int, int, int]:
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 1 for p in parts):
        raise click.BadParameter(f"{text!r}: expected X[,Y,Z] of positive integers", param_hint=hint)
    return tuple((parts + [1, 1])[:3])  # type: ignore[return-value]


def matching(table: KernelTable, name: str) -> list:
    matches = [k for k in table.kernels if name in (k.name, k.demangled)]
    if not matches:
        matches = [k for k in table.kernels if k.demangled.startswith(name) or base_name(k.demangled) in (name, name.split("<")[0])]
    if not matches:
        raise click.BadParameter(f"no kernel {name!r}; kernels: " + ", ".join(sorted({k.demangled for k in table.kernels})),
                                 param_hint="KERNEL")
    if len({k.name for k in matches}) > 1:
        raise click.BadParameter(f"{name!r} is ambiguous: " + ", ".join(sorted({k.demangled for k in matches})), param_hint="KERNEL")
    return matches


def base_name(demangled: str) -> str:
    """A kernel's name without return type, template arguments or parameters:
    `void tile_sums<16>(float const*)` -> tile_sums."""
    head = demangled.split("(")[0]
    depth, out = 0, ""
    for c in head:  # drop template argument lists, which may hold spaces
        depth += c == "<"
        if depth == 0:
            out += c
        depth -= c == ">"
    return out.split(" ")[-1].split("::")[-1]


def find_kernel(table: KernelTable, name: str, arch: int | str):
    matches = matching(table, name)
    best = best_record(matches, arch)
    if best is None:
        built = sorted({arch_name(k.arch) for k in matches if k.specializable})
        if built:  # HIP: the processor must be one it was built for; CUDA PTX: not newer than the GPU
            what = "bitcode" if target_for(arch).platform == "hip" else "code (PTX newer than the GPU does not assemble for it)"
            raise NoBitcodeError(f"kernel {matches[0].demangled} has no recorded {what} for {arch_name(arch)} "
                                 f"(it has for {', '.join(built)})")
        raise NoBitcodeError(f"kernel {matches[0].demangled} has neither recorded bitcode nor PTX")
    return best


def write_atomic(path: str, data: bytes) -> None:
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prefer_ptx() -> bool:
    # PROTEUS_CODE_KIND=ptx (jit/config.py): kernels carrying both are recorded from their PTX,
    # so that the two routes can be compared on one binary
    from ..jit.config import code_kind

    return code_kind(os.environ) == "ptx"  # (a value it does not know: a one-line ConfigError)


def extract(app: str, data: bytes) -> KernelTable:
    prefer_ptx = _prefer_ptx()

    def build(progress=None) -> KernelTable:
        try:
            return kernels_mod.build(data, app, progress, prefer_ptx=prefer_ptx)
        except ProteusError as exc:
            exc.path = exc.path or app
            raise

    if not sys.stderr.isatty():
        return build()
    from rich.progress import Progress

    with Progress(transient=True, console=err_console) as progress:
        task = progress.add_task(f"reading {os.path.basename(app)}", total=None)
        return build(lambda done, total: progress.update(task, completed=done, total=total))


def load(path: str) -> KernelTable:
    data = kernels_mod.read_input(path)
    if data[: len(store.MAGIC)] == store.MAGIC:
        return store.deserialize(data, path)
    try:
        return kernels_mod.build(data, path, prefer_ptx=_prefer_ptx())
    except ProteusError as exc:
        exc.path = exc.path or path
        raise


def require_code(table: KernelTable, app: str) -> None:
    """That some kernel can be specialized: it carries bitcode, or (CUDA) PTX."""
    if not table.kernels:
        raise NoBitcodeError("the fat binaries hold no kernels", app)
    if not table.kernels_specializable and table.app.platform == "hip":
        raise NoBitcodeError(
            f"none of its {len(table.kernels)} kernels carries LLVM bitcode (built without -fembed-bitcode?); "
            "rebuild with clang: clang++ -x hip --offload-arch=gfxXXX -fembed-bitcode ... (docs/user/hip.md)",
            app,
        )
    if not table.kernels_specializable and table.app.rdc and table.warnings:
        raise NoBitcodeError(f"none of its {len(table.kernels)} kernels can be specialized: {table.warnings[0]} "
                             "(-rdc: its translation units define device code differently, or not at all; "
                             "rebuild without -rdc, or with proteus-clang++ -fgpu-rdc)", app)
    if not table.kernels_specializable:
        raise NoBitcodeError(
            f"none of its {len(table.kernels)} kernels carries PTX or LLVM bitcode (SASS only: built with "
            "-gencode ...,code=sm_XX, -arch=sm_XXa or CMake's XX-real?); rebuild keeping PTX (nvcc -arch=sm_XX, "
            "CMake CUDA_ARCHITECTURES XX) or with proteus-clang++ (docs/user/build.md)",
            app,
        )


def table_to_json(table: KernelTable) -> dict:
    return {
        "tool": f"proteus-rewrite {__version__}",
        "app": dataclasses.asdict(table.app),
        "fatbins": [dataclasses.asdict(f) for f in table.fatbins],
        "modules": [
            {k: v for k, v in dataclasses.asdict(m).items() if k != "code"}
            | {"size": m.size} | ({"recipe": dataclasses.asdict(m.recipe)} if m.kind == "bitcode" else {})
            for m in table.modules
        ],
        "kernels": [dataclasses.asdict(k) | {"has_bitcode": k.has_bitcode, "route": route(k)} for k in table.kernels],
        "warnings": list(table.warnings),
    }


def print_table(table: KernelTable) -> None:
    # Piped output keeps one kernel per line rather than wrapping at 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
    a = table.app
    runtime = "hip" if a.platform == "hip" else f"cudart: {a.cudart}"
    console.print(f"[bold]{a.name}[/]  {a.size:,} bytes  {a.file_type}{' PIE' if a.pie else ''}"
                  f"{' stripped' if a.stripped else ''}  {runtime}{'  -fgpu-rdc' if a.rdc else ''}")
    if a.rewritten:
        console.print(f"  rewritten by {a.rewritten.get('tool', '?')} on {a.rewritten.get('rewritten', '?')} "
                      f"from {a.rewritten.get('original_name', '?')} (sha256 {str(a.rewritten.get('original_sha256', '?'))[:16]}...)")
    for f in table.fatbins:
        entries = ", ".join(f"{e.kind} {arch_name(e.arch)}{'' if e.compression == 'none' else ' ' + e.compression}" for e in f.entries)
        console.print(f"  fatbin {f.index}: {f.size:,} bytes at {f.section}+{f.offset:#x}: {entries}")
    for m in table.modules:
        if m.kind == "ptx":
            console.print(f"  module {m.index}: {m.size:,} bytes of PTX, {m.ptx_target or arch_name(m.arch)}")
            continue
        r = m.recipe
        how = "" if r.name == "unknown" else f", built with {r.name}, embedded {r.embedded}"
        console.print(f"  module {m.index}: {m.size:,} bytes of bitcode, {arch_name(m.arch)}, "
                      f"{os.path.basename(m.source_filename) or '?'}{how}")
    grid = Table(show_edge=False, header_style="bold")
    for col in ("kernel", "arch", "parameters", "bytes", "route", "globals", "launch bounds"):
        grid.add_column(col, overflow="fold", no_wrap=col in ("arch", "bytes"))
    for k in table.kernels:
        params = ", ".join(param_text(p) for p in k.params)
        bounds = ""
        if k.max_threads:
            bounds = "x".join(str(d) for d in k.max_threads) + (f", min {k.min_ctas}/SM" if k.min_ctas else "")
        grid.add_row(
            k.demangled + (f"  [dim]jit{list(k.jit_args)}[/]" if k.jit_args is not None else ""),
            arch_name(k.arch),
            params,
            str(k.param_size),
            f"{route(k)}, module {k.module}" + (f" +{list(k.link_modules)}" if k.link_modules else "")
            if k.specializable else "[red]none[/]",
            ", ".join(k.globals),
            bounds,
        )
    console.print(grid)
    n, nb = len(table.kernels), len(table.kernels_with_bitcode)
    npx = len(table.kernels_specializable) - nb
    console.print(f"{n} kernel(s), {nb} with bitcode" + (f", {npx} from PTX" if npx else ""))


def route(k) -> str:
    """How a kernel is specialized: from its bitcode, from its PTX (nvcc builds), or not at all."""
    return ("bitcode" if k.has_bitcode else "PTX") if k.specializable else "none"


def param_text(p) -> str:
    t = p.llvm_type or {"pointer": "ptr", "aggregate": "struct"}.get(p.kind, "?")
    return f"{t}:{p.size}" if p.kind in ("aggregate", "unknown") else t


