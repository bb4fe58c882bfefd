"""proteus-rewrite: run-time specialization of GPU kernels in already-built executables."""

__version__ = "0.1.0"


def import_path() -> list[str]:
    """The module path of a Python this one starts (the shim's interpreter, a compiler
    process): this package's own root first, then this process's sys.path. Those Pythons run
    without site handling, and an editable install is found through an import hook that only
    site handling sets up, so its root is named outright."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return [root] + [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) != root]
