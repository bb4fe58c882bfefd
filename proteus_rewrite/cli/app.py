"""The `proteus-rewrite` command group: its options, help and the default command."""

from __future__ import annotations

import logging
import re

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
  proteus-rewrite specialize proteus-out/app/app.kstore axpy_loop \\
      --arg 0=1048576 --arg 1=8 --arg 2=0.5 --block 256 --emit ptx
  proteus-rewrite cache stats           what the on-disk JIT cache holds
  PROTEUS_REPORT=run.json LD_PRELOAD=proteus-out/app/libproteus.so ./app
  proteus-rewrite report run.json       per kernel: launches specialized, variants, compile ms
  proteus-rewrite prewarm proteus-out/app --from run.json
                                        compile run.json's variants now: the next run starts warm

Exit codes: """ + "; ".join(f"{c} {n}" for c, n in EXIT_CODES.items())


def _verbosity(ctx: click.Context, param: click.Parameter, value: int) -> None:
    """-v counts wherever it is given, before the command or after it: -v inspect APP -v is -vv."""
    root = ctx.find_root()
    root.meta["proteus.verbose"] = root.meta.get("proteus.verbose", 0) + (value or 0)
    logging.basicConfig(format="proteus-rewrite: %(levelname)s: %(message)s")
    logging.getLogger().setLevel(max(logging.WARNING - 10 * root.meta["proteus.verbose"], logging.DEBUG))


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"proteus-rewrite, version {__version__}")
        ctx.exit()


def _verbose_option() -> click.Option:
    return click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_verbosity,
                        help="More log output (-vv for debug).")


def _version_option() -> click.Option:
    return click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True, callback=_version,
                        help="Show the version and exit.")


class _SharesGlobalOptions:
    """Every command takes the group's options too, so that they work where users put them:
    `proteus-rewrite inspect ./app -v` as well as `proteus-rewrite -v inspect ./app`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = {p.name for p in self.params}
        self.params += [make() for name, make in (("verbose", _verbose_option), ("version", _version_option))
                        if name not in names]


class SharedCommand(_SharesGlobalOptions, click.Command):
    pass


class SharedGroup(_SharesGlobalOptions, click.Group):
    command_class = SharedCommand
    group_class = type  # its subgroups are SharedGroups too


# The group's own options, which may come before the command name (and before APP when the
# command is left out): -v, -vv, --verbose, --version, -h, --help.
_GROUP_OPTION = re.compile(r"-v+|--verbose|--version|-h|--help")


class DefaultGroup(_SharesGlobalOptions, click.Group):
    """`proteus-rewrite APP ...` means `proteus-rewrite rewrite APP ...`, also after group options
    (`proteus-rewrite -v APP`) and when a rewrite option comes first (`proteus-rewrite -o D APP`)."""

    command_class = SharedCommand
    group_class = SharedGroup

    def parse_args(self, ctx, args):
        i = next((i for i, a in enumerate(args) if not _GROUP_OPTION.fullmatch(a)), len(args))
        if i < len(args) and args[i] != "--" and args[i] not in self.commands and self._starts_rewrite(ctx, args[i]):
            args = [*args[:i], "rewrite", *args[i:]]
        return super().parse_args(ctx, args)

    def _starts_rewrite(self, ctx, arg: str) -> bool:
        if not arg.startswith("-"):
            return True
        rewrite = self.commands.get("rewrite")
        params = rewrite.get_params(ctx) if rewrite else []
        return arg.split("=", 1)[0] in {n for p in params for n in getattr(p, "opts", ()) if n.startswith("-")}


@click.group(cls=DefaultGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx: click.Context) -> None:
    """Make CUDA executables specialize their kernels at run time.

    `proteus-rewrite APP` opens APP (built by clang with -Xclang -fembed-bitcode=all), records every
    kernel's LLVM bitcode and parameter layout in a kernel store, and writes it to the
    output directory (default ./proteus-out/<app>/).
    """
    _verbosity(ctx, None, 0)  # no -v: warnings only, in the same format
