"""The `proteus-rewrite` command group: its options, help and the default command."""

from __future__ import annotations

import logging

import click
from rich.console import Console

from .. import __version__
from ..errors import EXIT_CODES

log = logging.getLogger("proteus_rewrite")
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # one message, one line

EPILOG = """\b
Examples:
  proteus-rewrite ./app                 record ./app into ./proteus-out/app/
  proteus-rewrite ./app -o /tmp/jit     record into /tmp/jit/
  proteus-rewrite inspect ./app         list the kernels and their bitcode
  proteus-rewrite inspect ./app --json  the same, machine-readable
  proteus-rewrite specialize proteus-out/app/app.kstore axpy_loop \
      --arg 0=1048576 --arg 1=8 --arg 2=0.5 --block 256 --emit ptx
  proteus-rewrite cache stats           what the on-disk JIT cache holds
  PROTEUS_REPORT=run.json LD_PRELOAD=proteus-out/app/libproteus.so ./app
  proteus-rewrite report run.json       per kernel: launches specialized, variants, compile ms
  proteus-rewrite prewarm proteus-out/app --from run.json
                                        compile run.json's variants now: the next run starts warm

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

    `proteus-rewrite APP` opens APP (built by clang with -Xclang -fembed-bitcode=all), records every
    kernel's LLVM bitcode and parameter layout in a kernel store, and writes it to the
    output directory (default ./proteus-out/<app>/).
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="proteus-rewrite: %(levelname)s: %(message)s")


