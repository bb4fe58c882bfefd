"""proteus-rewrite APP: record the kernels, install the shim, write the rewritten executable."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
from pathlib import Path

import click

from .. import store
from ..errors import NotCudaBinaryError, ProteusError
from ..fatbin import hostelf, libraries
from ..fatbin import kernels as kernels_mod
from ..fatbin.layouts import ELF_MAGIC
from .app import EPILOG, err_console, main
from .common import extract, input_path, require_code

log = logging.getLogger("proteus_rewrite")

@main.command(epilog=EPILOG, context_settings={"ignore_unknown_options": True})
@click.argument("app", type=input_path())
@click.argument("app_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=str),
              help="Output directory (default: ./proteus-out/<app>/).")
@click.option("--force", is_flag=True, help="Rewrite an app that is itself a rewritten executable.")
@click.option("--validate", "check", is_flag=True,
              help="Then run the rewritten app with APP_ARGS (after --) checking every variant against its original "
                   "kernel, and write the kernels whose variants differ into the store as denied (exit 12 if any).")
@click.option("--ulps", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="With --validate: accept float results within this many units in the last place.")
@click.option("--lib", "libs", multiple=True, type=input_path(),
              help="Also record this shared library's kernels (one the app opens with dlopen; repeatable). "
                   "The libraries it needs are found as the loader finds them.")
@click.option("--no-libs", is_flag=True, help="Record APP alone, not the shared libraries it needs.")
def rewrite(app: str, app_args: tuple[str, ...], outdir: str | None, force: bool, check: bool, ulps: float,
            libs: tuple[str, ...], no_libs: bool) -> None:
    """Record APP's kernels, and those of the shared libraries it loads, into the output
    directory and write the rewritten APP beside them.

    The output directory gets APP.kstore (the kernel store; one more per library that holds
    kernels with bitcode, LIB.kstore), libproteus.so with proteus-python.cfg, and a copy of APP
    that loads libproteus.so by itself (APP itself is never modified). Run the copy, or APP
    with LD_PRELOAD=DIR/libproteus.so. Libraries the app opens with dlopen are not among its
    needed ones: name them with --lib.
    """
    from ..errors import InjectError
    from ..inject import rewrite as rewrite_mod
    from ..inject import shim

    if app_args and not check:  # before anything is written
        raise click.UsageError(f"unexpected arguments {' '.join(app_args)!r} (they are the app's with --validate)")
    outdir = outdir or os.path.join("proteus-out", os.path.basename(app.rstrip("/")) or "app")
    data = kernels_mod.read_input(app)
    try:
        table = extract(app, data)
        own_error = None
    except NotCudaBinaryError as exc:
        if data[:4] != ELF_MAGIC:
            raise
        table, own_error = None, exc
    recorded = _libraries(app, libs, no_libs, table)
    if table is None and not recorded:
        found = "" if no_libs else " nor does any shared library it needs"
        raise NotCudaBinaryError(f"{own_error.message}{found}; if it opens its kernels' library with dlopen, "
                                 "name that library with --lib", app)
    tables = ([table] if table is not None else []) + [t for _, t in recorded]
    if not any(t.kernels_specializable for t in tables):  # every recorded library has code: only APP is left
        require_code(table, app)
    if table is not None and table.kernels and not table.kernels_specializable:
        err_console.print(f"[yellow]warning:[/] {app}: none of its own {len(table.kernels)} kernels carries PTX or "
                          "bitcode; they run as built", markup=True)
        table = None
    elf = hostelf.parse(data)
    previous = rewrite_mod.marker(elf)
    if previous and not force:
        raise InjectError(f"already rewritten by {previous.get('tool', 'proteus-rewrite')}; "
                          "pass --force to rewrite it again", app)
    if (Path(outdir) / os.path.basename(app)).resolve() == Path(app).resolve():
        raise InjectError("the rewritten executable would replace the input; choose another output directory (-o)", app)
    names = [os.path.basename(app)] * (table is not None) + [t.app.name for _, t in recorded]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash:
        raise InjectError(f"two recorded objects are both named {clash}: their stores would overwrite each other", app)

    written = []
    if table is not None:
        written.append((app, table, store.write(table, store.store_path(outdir, table.app.name))))
    for path, t in recorded:
        written.append((path, t, store.write(t, store.store_path(outdir, t.app.name))))
    shim_path = shim.install(outdir)
    # A shared library keeps its store and shim (for LD_PRELOAD); only executables are rewritten.
    exe = rewrite_mod.rewrite(app, data, outdir, hashlib.sha256(data).hexdigest(), force=force) if elf.is_executable else None
    for path, t, spath in written:
        for w in t.warnings:
            err_console.print(f"[yellow]warning:[/] {w}")
        fatbins = len(t.fatbins)
        how = "HIP" if t.app.platform == "hip" else t.app.cudart + " cudart"
        from_ptx = len(t.kernels_specializable) - len(t.kernels_with_bitcode)
        click.echo(f"{path}: recorded {len(t.kernels)} kernel(s), {len(t.kernels_with_bitcode)} with bitcode, "
                   + (f"{from_ptx} from PTX, " if from_ptx else "") +
                   f"from {fatbins} fat binar{'y' if fatbins == 1 else 'ies'} ({how}) -> {spath}")
    preload = "LD_PRELOAD=" + shlex.quote(str(shim_path))
    if exe is not None:
        click.echo(f"rewritten executable: {exe} (or run the original with {preload} {shlex.quote(app)})")
    elif libraries.is_python_extension(app):
        click.echo(f"a Python extension module: run the Python that imports it with {preload} python ...")
    elif elf.file_type == "REL":
        click.echo(f"an object file: record the executable or library it is linked into instead "
                   f"(its kernels are found there); or run that app with {preload}")
    else:
        click.echo(f"a shared library: run the app that loads it with {preload} APP")
    if check:
        _validate_into_store(app, str(exe) if exe is not None else None, app_args, written, ulps)


def _libraries(app: str, explicit: tuple[str, ...], no_libs: bool, table) -> list[tuple[str, object]]:
    """(path, kernel table) of each library to record beside APP: those named with --lib, and
    those of APP's needed libraries that hold kernels with bitcode."""
    out, seen = [], set()
    for path in explicit:  # named by the user: any problem is an error
        data = kernels_mod.read_input(path)
        t = extract(path, data)
        require_code(t, path)
        out.append((path, t))
        seen.add(os.path.realpath(path))
    if no_libs:
        return out
    try:
        found = [lib for lib in libraries.needed(app) if lib.gpu or lib.path is None]
    except ProteusError as exc:  # the app itself was read above; a library the loader would reject is not ours to judge
        log.info("%s: needed libraries not searched: %s", app, exc)
        return out
    for lib in found:
        if lib.path is None:
            if not lib.vendor:
                err_console.print(f"warning: {app}: needs {lib.name}, which is not found from here (LD_LIBRARY_PATH?); "
                                  "if it holds kernels, name it with --lib", markup=False)
            continue
        real = os.path.realpath(lib.path)
        if real in seen or real == os.path.realpath(app):
            continue
        seen.add(real)
        try:
            t = extract(lib.path, kernels_mod.read_input(lib.path))
        except ProteusError as exc:
            err_console.print(f"warning: {lib.path}: {exc.message}; its kernels run as built", markup=False)
            continue
        if not t.kernels_specializable:
            err_console.print(f"warning: {lib.path}: {len(t.kernels)} kernel(s), none with PTX or embedded bitcode; "
                              "they run as built", markup=False)
            continue
        out.append((lib.path, t))
    return out


def _validate_into_store(app: str, exe: str | None, app_args: tuple[str, ...], written, ulps: float) -> None:
    """--validate: the rewritten app run once under validation; what differed goes into the store."""
    import dataclasses

    from ..errors import ValidationError
    from . import validate as validate_cmd

    if exe is None:
        raise ValidationError("--validate runs the rewritten executable; a shared library has none "
                              "(run its app with LD_PRELOAD and PROTEUS_VALIDATE=1)", app)
    doc = validate_cmd.run_validation(exe, app_args, ulps, 2048, None, fresh_cache=True)
    validate_cmd.print_summary(doc)
    denied = False
    for _, table, path in written:
        mine = validate_cmd.denied_kernels(doc, table)
        if mine:
            denied = True
            store.write(dataclasses.replace(table, denied=mine), path)
            click.echo(f"{path}: {len(mine)} kernel(s) denied: they run their original code")
    if doc["app_rc"] != 0:
        raise ValidationError(f"the app exited {doc['app_rc']} under validation", exe)
    if denied:
        raise ValidationError("a variant's results differ from its original kernel's (see above)", exe)


