"""proteus-rewrite inspect: an app's (or a store's) kernels, parameters, bitcode and build recipe."""

from __future__ import annotations

import json

import click

from .app import EPILOG, err_console, main
from .common import load, print_table, require_bitcode, table_to_json

@main.command(epilog=EPILOG)
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the kernel table as JSON.")
def inspect(app: str, as_json: bool) -> None:
    """Show APP's kernels, parameters and bitcode. APP may also be a kernel store (.kstore)."""
    table = load(app)
    require_bitcode(table, app)
    if as_json:
        click.echo(json.dumps(table_to_json(table), indent=2))
    else:
        print_table(table)
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")


