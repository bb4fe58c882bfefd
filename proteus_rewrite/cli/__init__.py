"""The `proteus-rewrite` command line: one module per command, registered on the group in app.py."""

from __future__ import annotations

import os
import sys

import click

from ..errors import ProteusError
from . import cache, inspect, job_summary, prewarm, report, rewrite, specialize, validate  # noqa: F401  (they register themselves)
from .app import err_console, main

__all__ = ["main", "run"]

# click 8.2 and later raise it where 8.1 printed the help and exited 0 by itself
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def run() -> None:
    """Console-script entry point: ProteusErrors become one line and their exit code, never a traceback."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except _NO_ARGS_IS_HELP as exc:  # `proteus-rewrite` or `proteus-rewrite cache` alone: the help
        exc.show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # a usage error: one line too, not click's three
        err_console.print(f"proteus-rewrite: error: {usage_line(exc)}", markup=False)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except ProteusError as exc:
        err_console.print(f"proteus-rewrite: error: {one_line(str(exc))}", markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for PROTEUS_DEBUG=1
        if os.environ.get("PROTEUS_DEBUG"):
            raise
        err_console.print(
            f"proteus-rewrite: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            "(set PROTEUS_DEBUG=1 for a traceback)",
            markup=False,
        )
        sys.exit(1)


def usage_line(exc: click.ClickException) -> str:
    """click's message, with where to read more: `... (see proteus-rewrite specialize --help)`."""
    message = one_line(exc.format_message())
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see {ctx.command_path} --help)" if ctx is not None else message


def one_line(text: str) -> str:
    # Only line breaks go: other whitespace may be part of a file's name.
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
