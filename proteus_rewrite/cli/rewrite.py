"""proteus-rewrite APP: record the kernels, install the shim, write the rewritten executable."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .. import store
from ..fatbin import kernels as kernels_mod
from .app import EPILOG, err_console, main
from .common import extract, require_bitcode

@main.command(epilog=EPILOG, context_settings={"ignore_unknown_options": True})
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.argument("app_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=str),
              help="Output directory (default: ./proteus-out/<app>/).")
@click.option("--force", is_flag=True, help="Rewrite an app that is itself a rewritten executable.")
@click.option("--validate", "check", is_flag=True,
              help="Then run the rewritten app with APP_ARGS (after --) checking every variant against its original "
                   "kernel, and write the kernels whose variants differ into the store as denied (exit 12 if any).")
@click.option("--ulps", type=float, default=0.0, show_default=True,
              help="With --validate: accept float results within this many units in the last place.")
def rewrite(app: str, app_args: tuple[str, ...], outdir: str | None, force: bool, check: bool, ulps: float) -> None:
    """Record APP's kernels into the output directory and write the rewritten APP beside them.

    The output directory gets APP.kstore (the kernel store), libproteus.so with
    proteus-python.cfg, and a copy of APP that loads libproteus.so by itself (APP itself is
    never modified). Run the copy, or APP with LD_PRELOAD=DIR/libproteus.so.
    """
    from ..errors import InjectError
    from ..inject import rewrite as rewrite_mod
    from ..inject import shim

    outdir = outdir or os.path.join("proteus-out", os.path.basename(app.rstrip("/")) or "app")
    data = kernels_mod.read_input(app)
    table = extract(app, data)
    require_bitcode(table, app)
    if table.app.rewritten and not force:
        raise InjectError(f"already rewritten by {table.app.rewritten.get('tool', 'proteus-rewrite')}; "
                          "pass --force to rewrite it again", app)
    if (Path(outdir) / table.app.name).resolve() == Path(app).resolve():
        raise InjectError("the rewritten executable would replace the input; choose another output directory (-o)", app)
    path = store.write(table, store.store_path(outdir, table.app.name))
    shim_path = shim.install(outdir)
    executable = table.app.file_type == "EXEC" or (table.app.file_type == "DYN" and table.app.pie)
    # A shared library keeps its store and shim (for LD_PRELOAD); only executables are rewritten.
    exe = rewrite_mod.rewrite(app, data, outdir, table.app.sha256, force=force) if executable else None
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    with_bc = len(table.kernels_with_bitcode)
    click.echo(
        f"{app}: recorded {len(table.kernels)} kernel(s), {with_bc} with bitcode, "
        f"from {len(table.fatbins)} fat binar{'y' if len(table.fatbins) == 1 else 'ies'} "
        f"({'HIP' if table.app.platform == 'hip' else table.app.cudart + ' cudart'}) -> {path}"
    )
    if exe is not None:
        click.echo(f"rewritten executable: {exe} (or run the original with LD_PRELOAD={shim_path})")
    else:
        click.echo(f"run it with: LD_PRELOAD={shim_path} {app}")
    if app_args and not check:
        raise click.UsageError(f"unexpected arguments {' '.join(app_args)!r} (they are the app's with --validate)")
    if check:
        _validate_into_store(app, str(exe) if exe is not None else None, app_args, table, path, ulps)


def _validate_into_store(app: str, exe: str | None, app_args: tuple[str, ...], table, path, ulps: float) -> None:
    """--validate: the rewritten app run once under validation; what differed goes into the store."""
    import dataclasses

    from ..errors import ValidationError
    from . import validate as validate_cmd

    if exe is None:
        raise ValidationError("--validate runs the rewritten executable; a shared library has none "
                              "(run its app with LD_PRELOAD and PROTEUS_VALIDATE=1)", app)
    doc = validate_cmd.run_validation(exe, app_args, ulps, 2048, None, fresh_cache=True)
    validate_cmd.print_summary(doc)
    denied = validate_cmd.denied_kernels(doc, table)
    if denied:
        store.write(dataclasses.replace(table, denied=denied), path)
        click.echo(f"{path}: {len(denied)} kernel(s) denied: they run their original code")
    if doc["app_rc"] != 0:
        raise ValidationError(f"the app exited {doc['app_rc']} under validation", exe)
    if denied:
        raise ValidationError("a variant's results differ from its original kernel's (see above)", exe)


