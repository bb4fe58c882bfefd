"""proteus-rewrite inspect: an app's (or a store's) kernels, parameters, bitcode and build recipe."""

from __future__ import annotations

import json

import click

from ..errors import NotCudaBinaryError, ProteusError
from .app import EPILOG, err_console, main
from .common import input_path, load, print_table, require_code, table_to_json


@main.command(epilog=EPILOG)
@click.argument("app", type=input_path())
@click.option("--json", "as_json", is_flag=True, help="Print the kernel table as JSON.")
def inspect(app: str, as_json: bool) -> None:
    """Show APP's kernels, parameters and bitcode. APP may also be a kernel store (.kstore)."""
    try:
        table = load(app)
    except NotCudaBinaryError as exc:
        raise NotCudaBinaryError(exc.message + _library_hint(app), exc.path) from None
    require_code(table, app)
    if as_json:
        click.echo(json.dumps(table_to_json(table), indent=2))
    else:
        print_table(table)
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")




def _library_hint(app: str) -> str:
    """Where an executable without GPU code keeps its kernels: its needed libraries that have some."""
    from ..fatbin import libraries

    try:
        found = [lib.path for lib in libraries.needed(app) if lib.gpu]
    except (ProteusError, OSError):
        return ""
    if not found:
        return ""
    return (f"; its kernels are in {', '.join(found)} (inspect those; `proteus-rewrite {app}` records them "
            "with the app)")
