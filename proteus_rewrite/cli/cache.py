"""proteus-rewrite cache ls | stats | clear | trim: the on-disk JIT cache (and trim: the shared tier)."""

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
  proteus-rewrite cache trim --max-mb 512
                                        least recently used entries out, down to 512 MiB
  proteus-rewrite cache trim --shared   the same for PROTEUS_CACHE_SHARED's tier

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




@cache.command("trim", epilog=CACHE_EPILOG)
@_dir_option
@click.option("--max-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Size to trim down to, in MiB (default: PROTEUS_CACHE_MAX_MB).")
@click.option("--shared", is_flag=True, help="Trim the shared tier (PROTEUS_CACHE_SHARED), not the node's directory.")
def cache_trim(directory, max_mb, shared):
    """Delete the least recently used entries until the cache holds at most --max-mb.

    The shared tier is never trimmed by the runs themselves (every rank doing it at once would
    load the file system for nothing): run this from one place, a job's epilogue or cron.
    """
    from ..cache import StorageCache
    from ..errors import CacheError, ConfigError
    from ..jit import Config

    cfg = Config.from_env()
    limit = max_mb if max_mb is not None else cfg.cache_max_mb
    if shared:
        if cfg.cache_shared is None:
            raise ConfigError("--shared: PROTEUS_CACHE_SHARED is not set (a file:// or redis:// URL)")
        if directory:
            raise ConfigError("--shared and --dir: the shared tier is PROTEUS_CACHE_SHARED's, give one of them")
        from ..tiers import open_shared

        tier, where = open_shared(cfg.cache_shared, cfg.cache_secret, cfg.cache_umask), _shown(cfg.cache_shared)
    else:
        tier = StorageCache(directory or cfg.cache_dir, cfg.cache_max_mb)
        where = str(tier.dir)
    try:
        n = tier.trim(limit)
    except OSError as exc:
        raise CacheError(f"cannot trim the cache: {exc.strerror or exc}", where) from None
    n = n if isinstance(n, int) else 0
    click.echo(f"trimmed {n} entr{'y' if n == 1 else 'ies'} from {where} (down to {limit:g} MiB)")


def _shown(url: str) -> str:
    """A URL as printed: its password as ***."""
    from ..jit.config import redacted_url

    return redacted_url(url)
