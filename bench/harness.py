"""What the bench scripts share (bench/hecbench, bench/upstream_tests, bench/apps): the
samples' build recipes, and a PROTEUS_REPORT summed over its kernels. The corpus and upstream
tarballs carry this file at their top, beside their folder, as the repository has it beside
theirs: each script imports it from its folder's parent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def samples_build():
    """samples/build.py, loaded by path (a script, not a package): its RECIPES and CUDA 13
    compat tree, so that every build matches the samples' and tests/support/clang.py's."""
    if "samples_build" in sys.modules:
        return sys.modules["samples_build"]
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def recipe_flags(recipe: str, sb) -> tuple[str, ...]:
    if recipe == "shared-lib":  # a layout, not a recipe: built as exact-fp (hecbench/corpus.py)
        recipe = "exact-fp"
    return () if recipe == "plain" else tuple(sb.RECIPES[recipe])


def report_share(report: dict) -> dict:
    """From a PROTEUS_REPORT (runtime.write_report): launches, specialized launches, their
    share, fallbacks, and the failures summed over kernels by reason."""
    launches = specialized = fallbacks = 0
    failures: dict[str, int] = {}
    for k in report.get("kernels", []):
        launches += int(k.get("launches", 0))
        specialized += int(k.get("specialized_launches", 0))
        fallbacks += int(k.get("fallback_launches", 0))
        for reason, count in (k.get("failures") or {}).items():
            failures[reason] = failures.get(reason, 0) + int(count)
    return {"launches": launches, "specialized_launches": specialized, "fallback_launches": fallbacks,
            "share": round(specialized / launches, 4) if launches else None, "failures": failures,
            "kernels": len(report.get("kernels", [])),
            "unknown_handle_launches": report.get("unknown_handle_launches", 0)}
