"""`python -m proteus_rewrite` runs the command line, as `proteus-rewrite` does."""

from .cli import run

run()
