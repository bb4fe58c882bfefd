"""proteus-rewrite prewarm: compile an earlier run's variants into the disk cache."""

from __future__ import annotations

import logging
import sys

import click

from ..errors import InputError, ProteusError
from ..runtime.report import read_report
from .app import EPILOG, err_console, main
from .common import find_kernel, load, store_path

log = logging.getLogger("proteus_rewrite")

@main.command(epilog=EPILOG)
@click.argument("store_or_app", metavar="STORE", type=click.Path(path_type=str))
@click.option("--from", "reports", multiple=True, required=True, type=click.Path(dir_okay=False, path_type=str),
              help="A PROTEUS_REPORT file of an earlier run (repeatable).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=str),
              help="Where to put the variants (default: PROTEUS_CACHE_DIR or the user cache directory, as at run time).")
def prewarm(store_or_app, reports, cache_dir):
    """Compile the variants an earlier run used into the disk cache, so the next run starts warm.

    That includes the variants the run asked for but had not compiled in the background when it
    ended (a kernel launched just before exit).

    STORE is the directory proteus-rewrite wrote (or its .kstore, or the app). Run this with the
    same PROTEUS_* settings, Python packages and GPU driver as the runs it prepares: they are
    part of every variant's cache key. Kernels that use device variables are keyed by their
    addresses, which the report records; a run that gets other addresses compiles anew.
    """
    from .. import jit
    from ..cache import make_chain

    table = load(store_path(store_or_app))
    config = jit.Config.from_env()
    chain = make_chain(True, cache_dir or config.cache_dir, config.cache_max_mb)
    todo, learned = [], {}
    for path in reports:
        doc = read_report(path)
        try:
            todo += [(k["name"], v["launch"], doc.get("driver_version") or None) for k in doc["kernels"]
                     for v in k.get("variants", []) if "launch" in v]
            # queued for a compile thread when that run ended (PROTEUS_ASYNC_COMPILATION 1 or auto)
            todo += [(k["name"], spec, doc.get("driver_version") or None) for k in doc["kernels"]
                     for spec in k.get("not_compiled", [])]
            for k in doc["kernels"]:
                for slot in (k.get("tracker") or {}).get("stopped_folding", []):
                    learned.setdefault(k["name"], []).append(str(slot))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a PROTEUS_REPORT file ({type(exc).__name__}: {exc})", path) from None
    by_name = {}
    for k in table.kernels:
        by_name.setdefault(k.name, []).append(k)
    counts = {"compiled": 0, "memory": 0, "disk": 0, "not in this store": 0, "failed": 0, "tracker decisions": 0}
    if config.tracker:  # what the value tracker learned: the next run starts from it, as after that run
        from ..policy import policy_key, save_learned

        sha = {f.index: f.sha256 for f in table.fatbins}
        for name, slots in learned.items():
            for record in by_name.get(name, []):
                key = policy_key(sha[record.fatbin], record.name, record.arch, config.tracker_threshold, config.tracker_ratio)
                save_learned(chain, key, record.arch, list(dict.fromkeys(slots)), record.demangled)
                counts["tracker decisions"] += 1
    # The next run starts with those slots unfolded, so the variants it asks for are the recorded
    # launches with them as run-time values; that run may have exited before compiling them.
    todo = [(name, without(spec, learned.get(name, ())), driver) for name, spec, driver in todo]
    seen = set()
    with click.progressbar(todo, label="prewarming", file=sys.stderr, show_pos=True) as bar:
        for name, spec, driver in bar:
            try:
                arch = spec["arch"] if isinstance(spec["arch"], str) else int(spec["arch"])  # gfx90a (HIP) or 90
                record = find_kernel(table, name, arch) if name in by_name else None
                if record is None:
                    counts["not in this store"] += 1
                    continue
                if not isinstance(spec["args"], dict):
                    raise TypeError("its args are not an object")
                grid, block = tuple(spec.get("grid") or ()), tuple(spec.get("block") or ())
                if not all(len(d) == 3 and all(isinstance(v, int) and v > 0 for v in d) for d in (grid, block)):
                    raise ValueError("grid and block need three positive integers each")
                raw = tuple(bytes.fromhex(spec["args"][str(p.index)]) if str(p.index) in spec["args"] else bytes(p.size)
                            for p in record.params)
                launch = jit.Launch(raw, grid, block, arch,
                                    {g: int(a) for g, a in spec.get("globals", {}).items()},
                                    frozenset(p.index for p in record.params if str(p.index) not in spec["args"]),
                                    frozenset(spec.get("unknown_dims", ())))
            except (ValueError, KeyError, TypeError) as exc:
                raise ProteusError(f"a variant of {name} is malformed ({type(exc).__name__}: {exc})", reports[0]) from None
            if (name, repr(spec)) in seen:
                continue
            seen.add((name, repr(spec)))
            try:
                result = jit.specialize(table, record, launch, config, chain, driver_version=driver)
                counts[result.source] += 1
            except ProteusError as exc:
                counts["failed"] += 1
                log.warning("%s: %s", record.demangled, exc)
    if not counts["failed"] and not counts["not in this store"]:
        # the next run compiles nothing, as after a run that compiled nothing: its prestart thread
        # leaves the compiler cold (policy.compiles_likely)
        from ..cache import Entry
        from ..policy import RUN_KIND, encode_run, run_key

        chain.put(Entry(run_key([f.sha256 for f in table.fatbins]), RUN_KIND, 0, encode_run(0),
                        {"kernel": "(the app's last run)"}))
    err_console.print("prewarm: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" -> {chain.levels[-1].dir}",
                      markup=False)
    if counts["failed"]:
        sys.exit(1)


def without(spec, slots) -> dict:
    """A recorded launch with the tracker's stopped slots (argument indices, "block", "grid") unfolded."""
    args, dims = (spec.get("args"), spec.get("unknown_dims") or []) if isinstance(spec, dict) else (None, None)
    if not slots or not isinstance(args, dict) or not isinstance(dims, list):
        return spec  # nothing to do, or malformed: reading it as a launch says so
    return {**spec, "args": {i: v for i, v in args.items() if i not in slots},
            "unknown_dims": sorted({*map(str, dims), *(s for s in slots if s in ("block", "grid"))})}


