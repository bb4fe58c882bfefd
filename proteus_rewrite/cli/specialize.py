"""proteus-rewrite specialize: what the JIT makes of one launch (IR, PTX, cubin or code object)."""

from __future__ import annotations

import sys

import click

from ..fatbin.table import arch_name
from ..runtime.files import atomic_write
from .app import EPILOG, err_console, main
from . import common
from .common import default_arch, dim3, find_kernel, load

@main.command(epilog=EPILOG)
@click.argument("store_or_app", metavar="STORE", type=click.Path(path_type=str))
@click.argument("kernel")
@click.option("--arg", "args", multiple=True, metavar="N=VALUE",
              help="Value of argument N (0-based): an int, a float, true/false, or hex bytes for a struct. "
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
    from ..jit import process, relink
    from ..jit.launch import parse_value

    table = load(store_or_app)
    hip = table.app.platform == "hip"
    sm = common.arch(arch) if arch else default_arch(table, kernel) if hip else 90
    if hip != isinstance(sm, str):
        raise click.BadParameter(f"{arch!r}: a {'HIP' if hip else 'CUDA'} app needs "
                                 f"{'an AMDGPU processor such as gfx90a' if hip else 'sm_XX'}", param_hint="--arch")
    emit = emit or ("ir" if hip else "ptx")
    if emit not in (("ir", "codeobj") if hip else ("ir", "ptx", "cubin")):
        raise click.BadParameter(f"{emit!r} is not what a {'HIP' if hip else 'CUDA'} kernel compiles to: "
                                 f"use {'ir or codeobj' if hip else 'ir, ptx or cubin'}", param_hint="--emit")
    record = find_kernel(table, kernel, sm)
    given: dict[int, str] = {}
    for a in args:
        idx, sep, value = a.partition("=")
        if not sep or not idx.strip().isdigit() or int(idx) >= len(record.params):
            raise click.BadParameter(f"{a!r}: expected N=VALUE with N in 0..{len(record.params) - 1}", param_hint="--arg")
        given[int(idx)] = value
    raw = tuple(parse_value(p, given[p.index]) if p.index in given else bytes(p.size) for p in record.params)
    addresses = {}
    for g in globals_:
        name, sep, addr = g.partition("=")
        try:
            addresses[name] = int(addr, 0)
        except ValueError:
            raise click.BadParameter(f"{g!r}: expected NAME=ADDRESS", param_hint="--global") from None
    redirect = bool(addresses) or not record.globals
    if block is None:
        bound = record.max_threads[0] * record.max_threads[1] * record.max_threads[2] if record.max_threads else 256
        block = str(min(256, bound))
    launch = jit.Launch(raw, dim3(grid, "--grid"), dim3(block, "--block"), sm, addresses,
                        frozenset(i for i in range(len(record.params)) if i not in given))
    config = jit.Config.from_env()
    # As at run time: LLVM and the PTX compiler run in a compiler process unless
    # PROTEUS_COMPILE_PROCESS=0, so that this command shows what an app would get.
    compiler = process.Compilers(sys.executable, quiet=False) if config.compile_process else None
    result = jit.specialize(table, record, launch, config, keep_ir=True, relink_globals=redirect, compiler=compiler)

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

        if emit == "cubin" and not isinstance(result.image, Cubin):
            raise click.UsageError("PROTEUS_PTX_COMPILER=driver produces no cubin offline; use --emit ptx")
        if not output and sys.stdout.isatty():
            raise click.UsageError(f"a {'cubin' if emit == 'cubin' else 'code object'} is binary: give -o FILE")
        data = result.image.data
    else:
        # the PTX as this launch would load it: device variables' pointers set (the cache keeps placeholders)
        data = (result.ir_text if emit == "ir" else relink.patch_image(result.ptx, result.plan.globals).text).encode()
    if output:
        atomic_write(output, data)
        err_console.print(f"wrote    {output}", markup=False)
    else:
        sys.stdout.buffer.write(data)


