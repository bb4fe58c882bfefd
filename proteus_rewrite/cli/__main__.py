"""python -m proteus_rewrite.cli"""

from . import run

run()
