"""proteus-rewrite validate APP [-- ARGS]: run a rewritten app once with every variant checked
against its original kernel (PROTEUS_VALIDATE, runtime/validate.py), and say what differed."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import click

from .. import store
from ..errors import InputError, NoGpuError, ValidationError
from .app import EPILOG, err_console, main
from .common import cache_dir_path, input_path, require_file


def run_validation(exe: str, args: tuple[str, ...], ulps: float, max_mb: int, cache_dir: str | None,
                   fresh_cache: bool = False) -> dict:
    """Run `exe ARGS` under validation (every launch waits for its variant, so that each is
    checked on its first launch) and answer its report: the app's exit code under "app_rc".
    The JIT cache, and the deny list in it, is `cache_dir`, else PROTEUS_CACHE_DIR or the
    default, where later runs find the deny list; fresh_cache: a temporary one."""
    shim_dir = Path(exe).resolve().parent
    if not (shim_dir / "libproteus.so").is_file() or not any(shim_dir.glob(f"*{store.SUFFIX}")):
        raise InputError("not a rewritten app: no libproteus.so and kernel store beside it "
                         "(run `proteus-rewrite APP` first, or `proteus-rewrite APP --validate -- ARGS`)", exe)
    with tempfile.TemporaryDirectory(prefix="proteus-validate-") as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, "PROTEUS_VALIDATE": "1", "PROTEUS_ASYNC_COMPILATION": "0", "PROTEUS_REPORT": str(report),
               "PROTEUS_VALIDATE_ULPS": str(ulps), "PROTEUS_VALIDATE_MAX_MB": str(max_mb)}
        if fresh_cache:  # a kernel an earlier run denied would be neither specialized nor checked
            env["PROTEUS_CACHE_DIR"] = str(Path(tmp) / "cache")
        elif cache_dir:
            env["PROTEUS_CACHE_DIR"] = cache_dir
        try:
            rc = subprocess.run([exe, *args], env=env).returncode
        except OSError as exc:
            raise InputError(f"cannot run: {exc.strerror or exc}", exe) from None
        if not report.exists():
            raise ValidationError(f"the app wrote no report (it exited {rc} before the run time started?)", exe)
        doc = json.loads(report.read_text())
    if doc.get("no_gpu"):  # the shim's word: nothing ran to compare, whatever the app's exit code says
        raise NoGpuError(f"no usable GPU: {doc['no_gpu']}", exe)
    doc["app_rc"] = rc
    return doc


def summarize(doc: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """(checked, differing, not checked) outcomes of a report's validation section; not checked:
    skipped, or an original whose own results vary from run to run."""
    outcomes = doc.get("validation") or []
    return ([o for o in outcomes if o["verdict"] in ("same", "within-ulps")],
            [o for o in outcomes if o["verdict"] == "differs"],
            [o for o in outcomes if o["verdict"] in ("skipped", "varies")])


def print_summary(doc: dict) -> None:
    checked, differing, skipped = summarize(doc)
    for o in doc.get("validation") or []:
        line = f"{o['verdict']:<11} {o['kernel']}"
        if o["verdict"] != "skipped":
            line += f"  ({o['allocations']} allocations, {o['bytes_compared']} bytes, {o['ms']:.1f} ms)"
        if o.get("reason"):
            line += f": {o['reason']}"
        err_console.print(line, markup=False)
    specialized = sum(k.get("specialized_launches", 0) for k in doc.get("kernels", []))
    err_console.print(f"validation: {len(checked)} variant(s) match their original, {len(differing)} differ "
                      f"(denied), {len(skipped)} not checked; {specialized} launch(es) ran specialized", markup=False)


def denied_kernels(doc: dict, table) -> dict[str, dict]:
    """The store's kernels whose variants differed, by mangled name, with what was found."""
    by_demangled = {k.demangled: k.name for k in table.kernels} | {k.name: k.name for k in table.kernels}
    return {by_demangled[o["kernel"]]: {"reason": o.get("reason", ""), "folded": o.get("folded", {})}
            for o in summarize(doc)[1] if o["kernel"] in by_demangled}


@main.command(epilog=EPILOG, context_settings={"ignore_unknown_options": True})
@click.argument("app", type=input_path())
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--ulps", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Accept float results that differ by at most this many units in the last place.")
@click.option("--max-mb", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Skip (and report) launches whose allocations hold more than this.")
@click.option("--cache-dir", type=cache_dir_path(),
              help="JIT cache, and the deny list in it, to use (default: PROTEUS_CACHE_DIR or the default cache, "
                   "where later runs read the deny list).")
def validate(app: str, args: tuple[str, ...], ulps: float, max_mb: int, cache_dir: str | None) -> None:
    """Run the rewritten APP once (with ARGS) checking every variant against its original kernel.

    Each variant's first launch runs on a copy of the memory its arguments point into, and
    its results are compared with the original kernel's, bit for bit (or within --ulps).
    The app goes on from the original's results, so its output is the native one. A variant
    that differs is denied (the deny list is in the cache directory; `proteus-rewrite APP
    --validate` puts it into the store). Exits 12 when a variant differed or the app failed,
    13 when there was no usable GPU to run it on.
    """
    from ..cache import StorageCache
    from ..jit import Config

    require_file(app)
    config = Config.from_env()  # the app's run time would only warn, and validate nothing
    StorageCache(cache_dir or config.cache_dir).check_writable()  # where the deny list goes
    doc = run_validation(app, args, ulps, max_mb, cache_dir)
    print_summary(doc)
    if doc["app_rc"] != 0:
        raise ValidationError(f"the app exited {doc['app_rc']} under validation", app)
    if summarize(doc)[1]:
        raise ValidationError("a variant's results differ from its original kernel's (see above)", app)
