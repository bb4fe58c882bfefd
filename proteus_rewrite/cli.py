"""The `proteus-rewrite` command line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from . import __version__, store
from .errors import EXIT_CODES, NoBitcodeError, ProteusError
from .fatbin import kernels as kernels_mod
from .fatbin.kernels import KernelTable

log = logging.getLogger("proteus_rewrite")
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # one message, one line

EPILOG = """\b
Examples:
  proteus-rewrite ./app                 record ./app into ./proteus-out/app/
  proteus-rewrite ./app -o /tmp/jit     record into /tmp/jit/
  proteus-rewrite inspect ./app         list the kernels and their bitcode
  proteus-rewrite inspect ./app --json  the same, machine-readable

Exit codes: 0 ok, 1 internal error, 2 usage, """ + ", ".join(f"{c} {n}" for c, n in EXIT_CODES.items())


class DefaultGroup(click.Group):
    """`proteus-rewrite APP ...` means `proteus-rewrite rewrite APP ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["rewrite", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="proteus-rewrite")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """Make CUDA executables specialize their kernels at run time.

    `proteus-rewrite APP` opens APP (built by clang with -fembed-bitcode), records every
    kernel's LLVM bitcode and parameter layout in a kernel store, and writes it to the
    output directory (default ./proteus-out/<app>/).
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="proteus-rewrite: %(levelname)s: %(message)s")


@main.command(epilog=EPILOG)
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=str),
              help="Output directory (default: ./proteus-out/<app>/).")
def rewrite(app: str, outdir: str | None) -> None:
    """Record APP's kernels into the output directory."""
    outdir = outdir or os.path.join("proteus-out", os.path.basename(app.rstrip("/")) or "app")
    table = _extract(app)
    _require_bitcode(table, app)
    path = store.write(table, store.store_path(outdir, table.app.name))
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    with_bc = len(table.kernels_with_bitcode)
    click.echo(
        f"{app}: recorded {len(table.kernels)} kernel(s), {with_bc} with bitcode, "
        f"from {len(table.fatbins)} fat binar{'y' if len(table.fatbins) == 1 else 'ies'} "
        f"({table.app.cudart} cudart) -> {path}"
    )


@main.command(epilog=EPILOG)
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the kernel table as JSON.")
def inspect(app: str, as_json: bool) -> None:
    """Show APP's kernels, parameters and bitcode. APP may also be a kernel store (.kstore)."""
    table = _load(app)
    _require_bitcode(table, app)
    if as_json:
        click.echo(json.dumps(table_to_json(table), indent=2))
    else:
        _print_table(table)
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")


def _extract(app: str) -> KernelTable:
    if not sys.stderr.isatty():
        return kernels_mod.extract(app)
    from rich.progress import Progress

    with Progress(transient=True, console=err_console) as progress:
        task = progress.add_task(f"reading {os.path.basename(app)}", total=None)
        return kernels_mod.extract(app, lambda done, total: progress.update(task, completed=done, total=total))


def _load(path: str) -> KernelTable:
    data = kernels_mod.read_input(path)
    if data[: len(store.MAGIC)] == store.MAGIC:
        return store.deserialize(data, path)
    try:
        return kernels_mod.build(data, path)
    except ProteusError as exc:
        exc.path = exc.path or path
        raise


def _require_bitcode(table: KernelTable, app: str) -> None:
    if not table.kernels:
        raise NoBitcodeError("the fat binaries hold no kernels", app)
    if not table.kernels_with_bitcode:
        raise NoBitcodeError(
            f"none of its {len(table.kernels)} kernels carries LLVM bitcode (built by nvcc, or without "
            "-fembed-bitcode?); rebuild with clang: clang++ -x cuda --cuda-gpu-arch=sm_XX -fembed-bitcode ...",
            app,
        )


def table_to_json(table: KernelTable) -> dict:
    return {
        "tool": f"proteus-rewrite {__version__}",
        "app": dataclasses.asdict(table.app),
        "fatbins": [dataclasses.asdict(f) for f in table.fatbins],
        "modules": [
            {k: v for k, v in dataclasses.asdict(m).items() if k != "bitcode"} | {"size": m.size}
            for m in table.modules
        ],
        "kernels": [dataclasses.asdict(k) | {"has_bitcode": k.has_bitcode} for k in table.kernels],
        "warnings": list(table.warnings),
    }


def _print_table(table: KernelTable) -> None:
    # Piped output keeps one kernel per line rather than wrapping at 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
    a = table.app
    console.print(f"[bold]{a.name}[/]  {a.size:,} bytes  {a.file_type}{' PIE' if a.pie else ''}"
                  f"{' stripped' if a.stripped else ''}  cudart: {a.cudart}{'  -fgpu-rdc' if a.rdc else ''}")
    for f in table.fatbins:
        entries = ", ".join(f"{e.kind} sm_{e.arch}{'' if e.compression == 'none' else ' ' + e.compression}" for e in f.entries)
        console.print(f"  fatbin {f.index}: {f.size:,} bytes at {f.section}+{f.offset:#x}: {entries}")
    for m in table.modules:
        console.print(f"  module {m.index}: {m.size:,} bytes of bitcode, sm_{m.arch}, {os.path.basename(m.source_filename) or '?'}")
    grid = Table(show_edge=False, header_style="bold")
    for col in ("kernel", "sm", "parameters", "bytes", "bitcode", "globals", "launch bounds"):
        grid.add_column(col, overflow="fold", no_wrap=col in ("sm", "bytes"))
    for k in table.kernels:
        params = ", ".join(_param_text(p) for p in k.params)
        bounds = ""
        if k.max_threads:
            bounds = "x".join(str(d) for d in k.max_threads) + (f", min {k.min_ctas}/SM" if k.min_ctas else "")
        grid.add_row(
            k.demangled + (f"  [dim]jit{list(k.jit_args)}[/]" if k.jit_args is not None else ""),
            str(k.arch),
            params,
            str(k.param_size),
            f"module {k.module}" + (f" +{list(k.link_modules)}" if k.link_modules else "") if k.has_bitcode else "[red]none[/]",
            ", ".join(k.globals),
            bounds,
        )
    console.print(grid)
    n, nb = len(table.kernels), len(table.kernels_with_bitcode)
    console.print(f"{n} kernel(s), {nb} with bitcode")


def _param_text(p) -> str:
    t = p.llvm_type or "?"
    return f"{t}:{p.size}" if p.kind in ("aggregate", "unknown") else t


def run() -> None:
    """Console-script entry point: ProteusErrors become one line and their exit code, never a traceback."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except ProteusError as exc:
        err_console.print(f"proteus-rewrite: error: {exc}", markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for PROTEUS_DEBUG=1
        if os.environ.get("PROTEUS_DEBUG"):
            raise
        err_console.print(
            f"proteus-rewrite: internal error: {type(exc).__name__}: {exc} (set PROTEUS_DEBUG=1 for a traceback)",
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    run()
