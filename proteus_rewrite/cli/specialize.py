"""proteus-rewrite specialize: what the JIT makes of one launch (IR, PTX, cubin or code object)."""

from __future__ import annotations

import os
import sys

import click

from ..errors import ProteusError
from ..fatbin.table import arch_name
from ..runtime.files import atomic_write
from . import common
from .app import EPILOG, err_console, main
from .common import default_arch, dim3, find_kernel, load


@main.command(epilog=EPILOG)
@click.argument("store_or_app", metavar="STORE", type=common.input_path())
@click.argument("kernel")
@click.option("--arg", "args", multiple=True, metavar="N=VALUE",
              help="Value of argument N (0-based): an int, a float or true/false (the arguments the JIT folds; "
                   "a pointer only with PROTEUS_SPECIALIZE_ALIGNMENT=1, for its alignment). "
                   "Arguments without a value are not folded.")
@click.option("--block", metavar="X[,Y,Z]", help="Block size (default: 256, or the kernel's __launch_bounds__ if smaller).")
@click.option("--grid", default="1", show_default=True, metavar="X[,Y,Z]", help="Grid size.")
@click.option("--arch", help="GPU architecture to compile for: sm_XX (CUDA, default sm_90) or an AMDGPU processor "
                             "such as gfx90a (HIP, default: the first one the kernel was built for).")
@click.option("--global", "globals_", multiple=True, metavar="NAME=ADDR",
              help="Address of a device variable in the AOT module (as the shim would supply it).")
@click.option("--emit", type=click.Choice(["ir", "ptx", "cubin", "codeobj"]),
              help="What to write: ir, ptx or cubin (CUDA; default ptx); ir or codeobj, the AMDGPU code object "
                   "hipModuleLoadData takes (HIP; default ir).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), help="Write here instead of stdout.")
def specialize(store_or_app, kernel, args, block, grid, arch, globals_, emit, output):
    """Specialize KERNEL of STORE (a .kstore or the app) for given argument values and show the code.

    KERNEL is a mangled or demangled name, or a unique prefix of one (e.g. axpy_loop).
    The PROTEUS_* variables apply as at run time.
    """
    from .. import jit
    from ..jit import process, relink, targets

    # Everything given is checked before anything is compiled or written.
    config = jit.Config.from_env()
    _check_output(output)
    table = load(common.store_path(store_or_app))
    hip = table.app.platform == "hip"
    sm = common.arch(arch) if arch else default_arch(table, kernel) if hip else 90
    if targets.target_for(sm).platform != table.app.platform:
        raise click.BadParameter(f"{arch!r}: a {'HIP' if hip else 'CUDA'} app needs "
                                 f"{'an AMDGPU processor such as gfx90a' if hip else 'sm_XX'}", param_hint="--arch")
    emit = emit or ("ir" if hip else "ptx")
    if emit not in (("ir", "codeobj") if hip else ("ir", "ptx", "cubin")):
        raise click.BadParameter(f"{emit!r} is not what a {'HIP' if hip else 'CUDA'} kernel compiles to: "
                                 f"use {'ir or codeobj' if hip else 'ir, ptx or cubin'}", param_hint="--emit")
    if emit in ("cubin", "codeobj") and not output and sys.stdout.isatty():
        raise click.UsageError(f"a {'cubin' if emit == 'cubin' else 'code object'} is binary: give -o FILE")
    record = find_kernel(table, kernel, sm)
    cg = config.for_record(record)
    if emit == "cubin" and cg.ptx_compiler == "driver":
        raise click.UsageError("PROTEUS_PTX_COMPILER=driver produces no cubin offline; use --emit ptx")
    given = _arguments(record, args, cg.specialize_alignment, cg.ptx_fold_floats)
    raw = tuple(given[p.index] if p.index in given else bytes(p.size) for p in record.params)
    addresses = {}
    for g in globals_:
        name, sep, addr = g.partition("=")
        try:
            addresses[name] = int(addr, 0)
        except ValueError:
            raise click.BadParameter(f"{g!r}: expected NAME=ADDRESS", param_hint="--global") from None
        if name not in record.globals:
            raise click.BadParameter(f"{g!r}: {record.demangled} uses no device variable {name!r}"
                                     + (f" (it uses {', '.join(record.globals)})" if record.globals else ""),
                                     param_hint="--global")
    missing = [g for g in record.globals if g not in addresses]
    if addresses and missing:
        raise click.BadParameter(f"give every device variable's address, or none: {', '.join(missing)} missing",
                                 param_hint="--global")
    redirect = bool(addresses) or not record.globals
    if block is None:
        bound = record.max_threads[0] * record.max_threads[1] * record.max_threads[2] if record.max_threads else 256
        block = str(min(256, bound))
    block_dims, grid_dims = dim3(block, "--block"), dim3(grid, "--grid")
    _check_dims(record, block_dims, grid_dims, hip)
    launch = jit.Launch(raw, grid_dims, block_dims, sm, addresses,
                        frozenset(i for i in range(len(record.params)) if i not in given))
    # As at run time: LLVM and the PTX compiler run in a compiler process unless
    # PROTEUS_COMPILE_PROCESS=0, so that this command shows what an app would get.
    compiler = process.Compilers(sys.executable, quiet=False) if config.compile_process else None
    try:
        result = jit.specialize(table, record, launch, config, keep_ir=True, relink_globals=redirect, compiler=compiler)
    except ProteusError as exc:
        exc.path = exc.path or store_or_app
        raise

    info = [f"kernel   {record.demangled} ({arch_name(sm)})", f"key      {result.key}"]
    info.append("folded   " + (", ".join(f"arg {i} = {v!r}" for i, v in sorted(result.folded.items())) or "nothing"))
    if result.plan.max_threads and hip:
        threads = result.plan.max_threads[0] * result.plan.max_threads[1] * result.plan.max_threads[2]
        info.append(f"bounds   amdgpu-flat-work-group-size 1,{threads}")
    elif result.plan.max_threads:
        info.append("bounds   maxntid {} minctasm {}".format(",".join(map(str, result.plan.max_threads)), result.plan.min_ctas))
    if result.plan.max_registers:
        info.append(f"registers at most {result.plan.max_registers} (the AOT code: {record.aot_registers})")
    info.extend(f"note     {n}" for n in result.notes)
    if record.globals and not redirect:
        info.append(f"globals  {', '.join(record.globals)} keep their own copies here (pass --global NAME=ADDR to redirect)")
    info.append("time     " + ", ".join(f"{k} {v:.1f} ms" for k, v in result.timings_ms.items()))
    if compiler is not None and compiler.nvjitlink:
        info.append(f"compiler process, {compiler.nvjitlink}")
    for line in info:
        err_console.print(line, markup=False)
    if emit in ("cubin", "codeobj"):
        from ..jit.codegen import Cubin

        if emit == "cubin" and not isinstance(result.image, Cubin):  # auto that came to the driver
            raise click.UsageError("PROTEUS_PTX_COMPILER=driver produces no cubin offline; use --emit ptx")
        data = result.image.data
    else:
        # the PTX as this launch would load it: device variables' pointers set (the cache keeps placeholders)
        data = (result.ir_text if emit == "ir" else relink.patch_image(result.ptx, result.plan.globals).text).encode()
    if output:
        atomic_write(output, data)
        err_console.print(f"wrote    {output}", markup=False)
    else:
        sys.stdout.buffer.write(data)


# What a launch may ask for: CUDA's limits on every device so far (the programming guide's table
# of compute capabilities); AMD's block limit, and its grid of at most 2^32 - 1 threads a dimension.
CUDA_BLOCK = (1024, 1024, 64)
CUDA_GRID = (2**31 - 1, 65535, 65535)
MAX_THREADS = 1024
HIP_GRID_THREADS = 2**32 - 1


def _check_dims(record, block: tuple[int, int, int], grid: tuple[int, int, int], hip: bool) -> None:
    text = ",".join(map(str, block))
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS:
        raise click.BadParameter(f"{text}: {threads} threads; a block has at most {MAX_THREADS}", param_hint="--block")
    if not hip and any(d > m for d, m in zip(block, CUDA_BLOCK)):
        raise click.BadParameter(f"{text}: a block is at most {','.join(map(str, CUDA_BLOCK))}", param_hint="--block")
    if record.max_threads:
        declared = record.max_threads[0] * record.max_threads[1] * record.max_threads[2]
        if threads > declared:
            raise click.BadParameter(f"{text}: {threads} threads; {record.demangled} is declared with "
                                     f"__launch_bounds__({declared})", param_hint="--block")
    if hip:
        if any(g * b > HIP_GRID_THREADS for g, b in zip(grid, block)):
            raise click.BadParameter(f"{','.join(map(str, grid))}: a grid holds at most {HIP_GRID_THREADS} threads "
                                     "in each dimension", param_hint="--grid")
    elif any(d > m for d, m in zip(grid, CUDA_GRID)):
        raise click.BadParameter(f"{','.join(map(str, grid))}: a grid is at most {','.join(map(str, CUDA_GRID))}",
                                 param_hint="--grid")


def _arguments(record, args: tuple[str, ...], alignment: bool, ptx_floats: bool = False) -> dict[int, bytes]:
    """--arg N=VALUE, each: the bytes of a parameter the JIT folds (or of a pointer, whose address
    gives alignment facts under PROTEUS_SPECIALIZE_ALIGNMENT=1). Any other value would be taken
    and then ignored, the variant folding less than asked, so it is refused."""
    from ..errors import SpecializeError
    from ..jit.launch import foldable, parse_value

    n = len(record.params)
    given: dict[int, bytes] = {}
    for a in args:
        idx, sep, value = a.partition("=")
        if not sep or not idx.strip().isdigit():
            raise click.BadParameter(f"{a!r}: expected N=VALUE, N an argument's index (0 to {n - 1})", param_hint="--arg")
        i = int(idx)
        if i >= n:
            raise click.BadParameter(f"{a!r}: {record.demangled} has {n} argument(s): N is 0 to {n - 1}", param_hint="--arg")
        if i in given:
            raise click.BadParameter(f"{a!r}: argument {i} is given twice", param_hint="--arg")
        p = record.params[i]
        if p.kind == "pointer" and not alignment:
            raise click.BadParameter(f"{a!r}: argument {i} is a pointer ({p.llvm_type}): pointers are never folded "
                                     "(its address gives alignment facts only with PROTEUS_SPECIALIZE_ALIGNMENT=1)",
                                     param_hint="--arg")
        if record.code == "ptx" and p.kind == "float" and not ptx_floats:
            raise click.BadParameter(f"{a!r}: argument {i} is floating-point: {record.demangled} is specialized from "
                                     "its PTX, where floating-point arguments are not folded (unless "
                                     "PROTEUS_PTX_FOLD_FLOATS=1)", param_hint="--arg")
        if p.kind != "pointer" and not foldable(p, record.code, ptx_floats):
            what = "a struct passed by value" if p.kind == "aggregate" else f"of kind {p.kind}"
            raise click.BadParameter(f"{a!r}: argument {i} ({p.llvm_type}) is {what}: only integer, floating-point "
                                     "and bool arguments are folded", param_hint="--arg")
        try:
            given[i] = parse_value(p, value)
        except SpecializeError:
            raise click.BadParameter(f"{a!r}: argument {i} ({p.llvm_type}) takes {_expected(p)}", param_hint="--arg") from None
    return given


def _expected(p) -> str:
    from ..jit.launch import INT_TYPES

    t = p.llvm_type
    if p.kind == "pointer":
        return "an address (an integer)"
    if t == "i1":
        return "0, 1, true or false"
    if t in INT_TYPES:
        bits = INT_TYPES[t] * 8
        return f"an integer from {-(1 << (bits - 1))} to {(1 << bits) - 1}"
    if t in ("half", "float", "double"):
        return f"a number ({t})"
    return f"no value this command can parse ({t})"


def _check_output(output: str | None) -> None:
    """-o FILE: its directory must be there, so that the code is not compiled for nothing."""
    if output is None:
        return
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise click.BadParameter(f"{output!r}: no directory {parent!r}", param_hint="-o")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{output!r}: cannot write into {parent!r}", param_hint="-o")
