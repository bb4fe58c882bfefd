"""proteus-rewrite cache ls | stats | clear: the on-disk JIT cache."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from ..fatbin import kernels as kernels_mod
from ..fatbin.table import arch_name
from .app import EPILOG, main
from .common import cache_dir_path

# Each cache command's own examples, then every command's (and the exit codes), as the other
# commands end their --help.
CACHE_EPILOG = """\b
Cache examples:
  proteus-rewrite cache ls              entries, most recently used first
  proteus-rewrite cache ls --json       the same, machine-readable
  proteus-rewrite cache stats --dir DIR another cache directory's size against its cap
  proteus-rewrite cache clear           delete every entry

""" + EPILOG


@main.group(epilog=CACHE_EPILOG)
def cache():
    """The on-disk JIT cache (PROTEUS_CACHE_DIR, default: the user cache directory)."""


def storage(directory: str | None):
    from ..cache import StorageCache
    from ..jit import Config

    cfg = Config.from_env()
    return StorageCache(directory or cfg.cache_dir, cfg.cache_max_mb)


_dir_option = click.option("--dir", "directory", type=cache_dir_path(),
                           help="Cache directory (default: PROTEUS_CACHE_DIR or the user cache directory).")


@cache.command("ls", epilog=CACHE_EPILOG)
@_dir_option
@click.option("--json", "as_json", is_flag=True)
def cache_ls(directory, as_json):
    """List the cached kernels, most recently used first."""
    from ..cache import describe

    store = storage(directory)
    rows = [describe(p) for p, _ in sorted(store.entries(), key=lambda e: -e[1].st_mtime)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    grid = Table(show_edge=False, header_style="bold")
    for col in ("key", "kernel", "kind", "arch", "bytes", "compile ms", "last used"):
        grid.add_column(col)
    for r in rows:
        if "error" in r:
            grid.add_row(r["file"], f"[red]{r['error']}[/]", "", "", "", "", "")
        else:
            grid.add_row(r["key"][:16], kernels_mod.demangle(r["kernel"]), r["kind"], arch_name(r["arch"]), f"{r['bytes']:,}",
                         f"{r['compile_ms']:.1f}" if r["compile_ms"] is not None else "", r["last_used"])
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(grid)
    click.echo(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'} in {store.dir}")


@cache.command("stats", epilog=CACHE_EPILOG)
@_dir_option
def cache_stats(directory):
    """Entries, size and cap of the cache."""
    store = storage(directory)
    entries = store.entries()
    total = sum(st.st_size for _, st in entries)
    click.echo(f"directory  {store.dir}")
    click.echo(f"entries    {len(entries)}")
    click.echo(f"size       {total / 1e6:.2f} MB of {store.max_bytes / 2**20:g} MiB (PROTEUS_CACHE_MAX_MB)")


@cache.command("clear", epilog=CACHE_EPILOG)
@_dir_option
def cache_clear(directory):
    """Delete every cached kernel."""
    store = storage(directory)
    n = store.clear()
    click.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} from {store.dir}")


