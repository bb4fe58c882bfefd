"""proteus-rewrite prewarm: compile an earlier run's variants into the disk cache."""

from __future__ import annotations

import logging
import sys

import click

from ..errors import InputError, ProteusError
from ..runtime.report import LaunchRecord, read_report
from .app import EPILOG, err_console, main
from .common import cache_dir_path, find_kernel, input_path, load, store_paths

log = logging.getLogger("proteus_rewrite")

@main.command(epilog=EPILOG)
@click.argument("store_or_app", metavar="STORE", type=input_path())
@click.option("--from", "reports", multiple=True, required=True, type=input_path(),
              help="A PROTEUS_REPORT file of an earlier run (repeatable).")
@click.option("--cache-dir", type=cache_dir_path(),
              help="Where to put the variants (default: PROTEUS_CACHE_DIR or the user cache directory, as at run time).")
def prewarm(store_or_app, reports, cache_dir):
    """Compile the variants an earlier run used into the disk cache, so the next run starts warm.

    That includes the variants the run asked for but had not compiled in the background when it
    ended (a kernel launched just before exit).

    STORE is the directory proteus-rewrite wrote (all its stores: the app's and those of its
    libraries), or one .kstore, or the app. Run this with the
    same PROTEUS_* settings, Python packages and GPU driver as the runs it prepares: they are
    part of every variant's cache key. Kernels that use device variables are prewarmed like any
    other: the key holds the variables' names, and each run sets their addresses in the image
    it loads.
    """
    from .. import jit
    from ..cache import make_chain
    from ..tiers import shared_from_config

    config = jit.Config.from_env()
    todo, learned = [], {}
    for path in reports:
        doc = read_report(path)
        try:
            todo += [(k["name"], v["launch"], doc.get("driver_version") or None, path) for k in doc["kernels"]
                     for v in k.get("variants", []) if "launch" in v]
            # queued for a compile thread when that run ended (PROTEUS_ASYNC_COMPILATION 1 or auto)
            todo += [(k["name"], spec, doc.get("driver_version") or None, path) for k in doc["kernels"]
                     for spec in k.get("not_compiled", [])]
            for k in doc["kernels"]:
                for slot in (k.get("tracker") or {}).get("stopped_folding", []):
                    learned.setdefault(k["name"], []).append(str(slot))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a PROTEUS_REPORT file ({type(exc).__name__}: {exc})", path) from None
    tables = [load(p) for p in store_paths(store_or_app)]
    chain = make_chain(True, cache_dir or config.cache_dir, config.cache_max_mb, shared=shared_from_config(config))
    disk = chain.disk
    assert disk is not None
    disk.check_writable()  # a cache that takes nothing is said at once, not after compiling every variant
    by_name: dict[str, list] = {}  # a kernel's name -> (its store, its record) for each store that has it
    for table in tables:
        for k in table.kernels:
            by_name.setdefault(k.name, []).append((table, k))
    counts = {"compiled": 0, "memory": 0, "disk": 0, "shared": 0, "not in this store": 0, "failed": 0, "not stored": 0,
              "tracker decisions": 0}
    # The next run starts with the tracker's slots unfolded, so the variants it asks for are the
    # recorded launches with them as run-time values; that run may have exited before compiling them.
    # Every launch is read before anything is compiled or stored: a malformed one stops the command.
    launches, seen = [], set()
    for name, spec, driver, path in todo:
        try:
            recorded = LaunchRecord.from_json(spec).without(learned.get(name, ()))
            # the first store with a record of it for this arch: an app and its libraries rarely share a name
            table, record = next(((t, r) for t in tables if any(t is u for u, _ in by_name.get(name, ()))
                                  and (r := _find(t, name, recorded.arch)) is not None), (None, None))
            if record is None:
                counts["not in this store"] += 1
                continue
            launch = recorded.launch(record)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"a variant of {name} is malformed ({type(exc).__name__}: {exc})", path) from None
        if (name, recorded) not in seen:
            seen.add((name, recorded))
            launches.append((table, record, launch, driver))
    if config.tracker:  # what the value tracker learned: the next run starts from it, as after that run
        from ..policy import policy_key, save_learned

        for name, slots in learned.items():
            for table, record in by_name.get(name, []):
                key = policy_key(table.fatbin(record.fatbin).sha256, record.name, record.arch, config.tracker_threshold,
                                 config.tracker_ratio)
                failures = sum(chain.put_errors.values())
                save_learned(chain, key, record.arch, list(dict.fromkeys(slots)), record.demangled)
                counts["not stored" if sum(chain.put_errors.values()) > failures else "tracker decisions"] += 1
    with click.progressbar(launches, label="prewarming", file=sys.stderr, show_pos=True) as bar:
        for table, record, launch, driver in bar:
            try:
                # a variant another process is compiling (ranks prewarming one shared cache): wait
                # for its entry, backing off, up to the claim's lease; then break it and compile
                result = jit.specialize(table, record, launch, config, chain, driver_version=driver,
                                        claim_wait_s=chain.lease_s + 5.0)
            except ProteusError as exc:
                counts["failed"] += 1
                log.warning("%s: %s", record.demangled, exc)
                continue
            counts[result.source] += 1
            # the cache warns once and goes on, as a run does; here an entry not on disk is a failure
            if not disk.path(result.key).is_file():
                counts["not stored"] += 1
    if not counts["failed"] and not counts["not in this store"] and not counts["not stored"]:
        # the next run compiles nothing, as after a run that compiled nothing: its prestart thread
        # leaves the compiler cold (policy.compiles_likely)
        from ..cache import Entry
        from ..policy import RUN_KIND, encode_run, run_key

        chain.put(Entry(run_key([f.sha256 for t in tables for f in t.fatbins]), RUN_KIND, 0, encode_run(0),
                        {"kernel": "(the app's last run)"}))
    err_console.print("prewarm: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" -> {disk.dir}",
                      markup=False)
    claims = chain.claim_stats
    if chain.shared is not None or claims["lost"]:
        err_console.print(f"prewarm: claims won {claims['won']:.0f}, lost {claims['lost']:.0f}, broken {claims['broken']:.0f}, "
                          f"waited {claims['wait_s']:.1f} s, shared hits {claims['shared_hits']:.0f}", markup=False)
    if counts["failed"] or counts["not stored"] or chain.put_errors:
        sys.exit(1)


def _find(table, name: str, arch):
    try:
        return find_kernel(table, name, arch)
    except (ProteusError, click.BadParameter):  # no bitcode for that arch in this store: another may have it
        return None
