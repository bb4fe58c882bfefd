"""The `proteus-rewrite` command line: one module per command, registered on the group in app.py."""

from __future__ import annotations

import os
import sys

import click

from ..errors import ProteusError
from . import cache, inspect, prewarm, report, rewrite, specialize, validate  # noqa: F401  (they register themselves)
from .app import err_console, main

__all__ = ["main", "run"]


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
