"""What the corpus builders share (bench/corpora/apps, hecbench and upstream_tests build.py):
the samples' build recipes and CUDA 13 compat tree (samples/build.py), so that every build
matches the samples' and tests/support/clang.py's, and the runner's files for a tarball.
Not carried to GPU hosts."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from pathlib import Path

from bench.lib.paths import ROOT
from samples import build as samples_build

__all__ = ["pack_runner", "recipe_flags", "samples_build"]

# What a corpus runner imports beside its own folder: the packages above it and the harness
# (standard library only, like the runners themselves).
RUNNER_PACKAGE = ("bench/__init__.py", "bench/lib/__init__.py", "bench/lib/harness.py", "bench/corpora/__init__.py")


def recipe_flags(recipe: str) -> tuple[str, ...]:
    if recipe == "shared-lib":  # a layout, not a recipe: built as exact-fp (hecbench/corpus.py)
        recipe = "exact-fp"
    return () if recipe == "plain" else tuple(samples_build.RECIPES[recipe])


def pack_runner(tar: tarfile.TarFile, folder: Path, files: Iterable[str]) -> str:
    """Add a corpus runner to `tar` in the repository's layout, so that it runs from the
    unpacked tarball's top as `python3 -m bench.corpora.NAME.run`: `folder`'s __init__.py and
    `files`, and RUNNER_PACKAGE. Returns the folder's path in the tarball (work/ goes under it)."""
    top = folder.resolve().relative_to(ROOT).as_posix()
    for rel in RUNNER_PACKAGE:
        tar.add(ROOT / rel, arcname=rel)
    for name in ("__init__.py", *files):
        tar.add(folder / name, arcname=f"{top}/{name}")
    return top
