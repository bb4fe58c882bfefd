"""python -m proteus_rewrite.runtime > shim/protocol.h: the C side of runtime/protocol.py."""

import sys

from .protocol import header

sys.stdout.write(header())
