"""The `proteus-rewrite` command line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from . import __version__, store
from .errors import EXIT_CODES, InputError, NoBitcodeError, ProteusError
from .fatbin import kernels as kernels_mod
from .fatbin.kernels import KernelTable
from .fatbin.table import arch_name, best_for_arch

log = logging.getLogger("proteus_rewrite")
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # one message, one line

EPILOG = """\b
Examples:
  proteus-rewrite ./app                 record ./app into ./proteus-out/app/
  proteus-rewrite ./app -o /tmp/jit     record into /tmp/jit/
  proteus-rewrite inspect ./app         list the kernels and their bitcode
  proteus-rewrite inspect ./app --json  the same, machine-readable
  proteus-rewrite specialize proteus-out/app/app.kstore axpy_loop \
      --arg 0=1048576 --arg 1=8 --arg 2=0.5 --block 256 --emit ptx
  proteus-rewrite cache stats           what the on-disk JIT cache holds
  PROTEUS_REPORT=run.json LD_PRELOAD=proteus-out/app/libproteus.so ./app
  proteus-rewrite report run.json       per kernel: launches specialized, variants, compile ms
  proteus-rewrite prewarm proteus-out/app --from run.json
                                        compile run.json's variants now: the next run starts warm

Exit codes: 0 ok, 1 internal error, 2 usage, """ + ", ".join(f"{c} {n}" for c, n in EXIT_CODES.items())


class DefaultGroup(click.Group):
    """`proteus-rewrite APP ...` means `proteus-rewrite rewrite APP ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["rewrite", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="proteus-rewrite")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """Make CUDA executables specialize their kernels at run time.

    `proteus-rewrite APP` opens APP (built by clang with -Xclang -fembed-bitcode=all), records every
    kernel's LLVM bitcode and parameter layout in a kernel store, and writes it to the
    output directory (default ./proteus-out/<app>/).
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="proteus-rewrite: %(levelname)s: %(message)s")


@main.command(epilog=EPILOG)
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=str),
              help="Output directory (default: ./proteus-out/<app>/).")
@click.option("--force", is_flag=True, help="Rewrite an app that is itself a rewritten executable.")
def rewrite(app: str, outdir: str | None, force: bool) -> None:
    """Record APP's kernels into the output directory and write the rewritten APP beside them.

    The output directory gets APP.kstore (the kernel store), libproteus.so with
    proteus-python.cfg, and a copy of APP that loads libproteus.so by itself (APP itself is
    never modified). Run the copy, or APP with LD_PRELOAD=DIR/libproteus.so.
    """
    from .errors import InjectError
    from .inject import rewrite as rewrite_mod
    from .inject import shim

    outdir = outdir or os.path.join("proteus-out", os.path.basename(app.rstrip("/")) or "app")
    data = kernels_mod.read_input(app)
    table = _extract(app, data)
    _require_bitcode(table, app)
    if table.app.rewritten and not force:
        raise InjectError(f"already rewritten by {table.app.rewritten.get('tool', 'proteus-rewrite')}; "
                          "pass --force to rewrite it again", app)
    if (Path(outdir) / table.app.name).resolve() == Path(app).resolve():
        raise InjectError("the rewritten executable would replace the input; choose another output directory (-o)", app)
    path = store.write(table, store.store_path(outdir, table.app.name))
    shim_path = shim.install(outdir)
    executable = table.app.file_type == "EXEC" or (table.app.file_type == "DYN" and table.app.pie)
    # A shared library keeps its store and shim (for LD_PRELOAD); only executables are rewritten.
    exe = rewrite_mod.rewrite(app, data, outdir, table.app.sha256, force=force) if executable else None
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    with_bc = len(table.kernels_with_bitcode)
    click.echo(
        f"{app}: recorded {len(table.kernels)} kernel(s), {with_bc} with bitcode, "
        f"from {len(table.fatbins)} fat binar{'y' if len(table.fatbins) == 1 else 'ies'} "
        f"({'HIP' if table.app.platform == 'hip' else table.app.cudart + ' cudart'}) -> {path}"
    )
    if exe is not None:
        click.echo(f"rewritten executable: {exe} (or run the original with LD_PRELOAD={shim_path})")
    else:
        click.echo(f"run it with: LD_PRELOAD={shim_path} {app}")


@main.command(epilog=EPILOG)
@click.argument("app", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the kernel table as JSON.")
def inspect(app: str, as_json: bool) -> None:
    """Show APP's kernels, parameters and bitcode. APP may also be a kernel store (.kstore)."""
    table = _load(app)
    _require_bitcode(table, app)
    if as_json:
        click.echo(json.dumps(table_to_json(table), indent=2))
    else:
        _print_table(table)
    for w in table.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")


@main.command(epilog=EPILOG)
@click.argument("store_or_app", metavar="STORE", type=click.Path(path_type=str))
@click.argument("kernel")
@click.option("--arg", "args", multiple=True, metavar="N=VALUE",
              help="Value of argument N (0-based): an int, a float, true/false, or hex bytes for a struct. "
                   "Arguments without a value are not folded.")
@click.option("--block", metavar="X[,Y,Z]", help="Block size (default: 256, or the kernel's __launch_bounds__ if smaller).")
@click.option("--grid", default="1", show_default=True, metavar="X[,Y,Z]", help="Grid size.")
@click.option("--arch", help="GPU architecture to compile for: sm_XX (CUDA, default sm_90) or an AMDGPU processor "
                             "such as gfx90a (HIP, default: the first one the kernel was built for).")
@click.option("--global", "globals_", multiple=True, metavar="NAME=ADDR",
              help="Address of a device variable in the AOT module (as the shim would supply it).")
@click.option("--emit", type=click.Choice(["ir", "ptx", "cubin", "codeobj"]),
              help="What to write: ir, ptx or cubin (CUDA; default ptx); ir or codeobj, the AMDGPU code object "
                   "hipModuleLoadData takes (HIP; default ir).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), help="Write here instead of stdout.")
def specialize(store_or_app, kernel, args, block, grid, arch, globals_, emit, output):
    """Specialize KERNEL of STORE (a .kstore or the app) for given argument values and show the code.

    KERNEL is a mangled or demangled name, or a unique prefix of one (e.g. axpy_loop).
    The PROTEUS_* variables apply as at run time.
    """
    from . import jit
    from .jit import process
    from .jit.launch import parse_value

    table = _load(store_or_app)
    hip = table.app.platform == "hip"
    sm = _arch(arch) if arch else _default_arch(table, kernel) if hip else 90
    if hip != isinstance(sm, str):
        raise click.BadParameter(f"{arch!r}: a {'HIP' if hip else 'CUDA'} app needs "
                                 f"{'an AMDGPU processor such as gfx90a' if hip else 'sm_XX'}", param_hint="--arch")
    emit = emit or ("ir" if hip else "ptx")
    if emit not in (("ir", "codeobj") if hip else ("ir", "ptx", "cubin")):
        raise click.BadParameter(f"{emit!r} is not what a {'HIP' if hip else 'CUDA'} kernel compiles to: "
                                 f"use {'ir or codeobj' if hip else 'ir, ptx or cubin'}", param_hint="--emit")
    record = _find_kernel(table, kernel, sm)
    given: dict[int, str] = {}
    for a in args:
        idx, sep, value = a.partition("=")
        if not sep or not idx.strip().isdigit() or int(idx) >= len(record.params):
            raise click.BadParameter(f"{a!r}: expected N=VALUE with N in 0..{len(record.params) - 1}", param_hint="--arg")
        given[int(idx)] = value
    raw = tuple(parse_value(p, given[p.index]) if p.index in given else bytes(p.size) for p in record.params)
    addresses = {}
    for g in globals_:
        name, sep, addr = g.partition("=")
        try:
            addresses[name] = int(addr, 0)
        except ValueError:
            raise click.BadParameter(f"{g!r}: expected NAME=ADDRESS", param_hint="--global") from None
    relink = bool(addresses) or not record.globals
    if block is None:
        bound = record.max_threads[0] * record.max_threads[1] * record.max_threads[2] if record.max_threads else 256
        block = str(min(256, bound))
    launch = jit.Launch(raw, _dim3(grid, "--grid"), _dim3(block, "--block"), sm, addresses,
                        frozenset(i for i in range(len(record.params)) if i not in given))
    config = jit.Config.from_env()
    # As at run time: LLVM and the PTX compiler run in a compiler process unless
    # PROTEUS_COMPILE_PROCESS=0, so that this command shows what an app would get.
    compiler = process.Compilers(sys.executable, quiet=False) if config.compile_process else None
    result = jit.specialize(table, record, launch, config, keep_ir=True, relink_globals=relink, compiler=compiler)

    info = [f"kernel   {record.demangled} ({arch_name(sm)})", f"key      {result.key}"]
    info.append("folded   " + (", ".join(f"arg {i} = {v!r}" for i, v in sorted(result.folded.items())) or "nothing"))
    if result.plan.max_threads and hip:
        threads = result.plan.max_threads[0] * result.plan.max_threads[1] * result.plan.max_threads[2]
        info.append(f"bounds   amdgpu-flat-work-group-size 1,{threads}")
    elif result.plan.max_threads:
        info.append("bounds   maxntid {} minctasm {}".format(",".join(map(str, result.plan.max_threads)), result.plan.min_ctas))
    if record.globals and not relink:
        info.append(f"globals  {', '.join(record.globals)} keep their own copies here (pass --global NAME=ADDR to redirect)")
    info.append("time     " + ", ".join(f"{k} {v:.1f} ms" for k, v in result.timings_ms.items()))
    if compiler is not None and compiler.nvjitlink:
        info.append(f"compiler process, {compiler.nvjitlink}")
    for line in info:
        err_console.print(line, markup=False)
    if emit in ("cubin", "codeobj"):
        from .jit.codegen import Cubin

        if emit == "cubin" and not isinstance(result.image, Cubin):
            raise click.UsageError("PROTEUS_PTX_COMPILER=driver produces no cubin offline; use --emit ptx")
        if not output and sys.stdout.isatty():
            raise click.UsageError(f"a {'cubin' if emit == 'cubin' else 'code object'} is binary: give -o FILE")
        data = result.image.data
    else:
        data = (result.ir_text if emit == "ir" else result.ptx.text).encode()
    if output:
        _write_atomic(output, data)
        err_console.print(f"wrote    {output}", markup=False)
    else:
        sys.stdout.buffer.write(data)


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
    from . import jit
    from .cache import make_chain

    table = _load(_store_path(store_or_app))
    config = jit.Config.from_env()
    chain = make_chain(True, cache_dir or config.cache_dir, config.cache_max_mb)
    todo, learned = [], {}
    for path in reports:
        doc = _read_report(path)
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
        from .policy import policy_key, save_learned

        sha = {f.index: f.sha256 for f in table.fatbins}
        for name, slots in learned.items():
            for record in by_name.get(name, []):
                key = policy_key(sha[record.fatbin], record.name, record.arch, config.tracker_threshold, config.tracker_ratio)
                save_learned(chain, key, record.arch, list(dict.fromkeys(slots)), record.demangled)
                counts["tracker decisions"] += 1
    # The next run starts with those slots unfolded, so the variants it asks for are the recorded
    # launches with them as run-time values; that run may have exited before compiling them.
    todo = [(name, _without(spec, learned.get(name, ())), driver) for name, spec, driver in todo]
    seen = set()
    with click.progressbar(todo, label="prewarming", file=sys.stderr, show_pos=True) as bar:
        for name, spec, driver in bar:
            try:
                arch = spec["arch"] if isinstance(spec["arch"], str) else int(spec["arch"])  # gfx90a (HIP) or 90
                record = _find_kernel(table, name, arch) if name in by_name else None
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
        from .cache import Entry
        from .policy import RUN_KIND, encode_run, run_key

        chain.put(Entry(run_key([f.sha256 for f in table.fatbins]), RUN_KIND, 0, encode_run(0),
                        {"kernel": "(the app's last run)"}))
    err_console.print("prewarm: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" -> {chain.levels[-1].dir}",
                      markup=False)
    if counts["failed"]:
        sys.exit(1)


def _without(spec, slots) -> dict:
    """A recorded launch with the tracker's stopped slots (argument indices, "block", "grid") unfolded."""
    args, dims = (spec.get("args"), spec.get("unknown_dims") or []) if isinstance(spec, dict) else (None, None)
    if not slots or not isinstance(args, dict) or not isinstance(dims, list):
        return spec  # nothing to do, or malformed: reading it as a launch says so
    return {**spec, "args": {i: v for i, v in args.items() if i not in slots},
            "unknown_dims": sorted({*map(str, dims), *(s for s in slots if s in ("block", "grid"))})}


def _read_report(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    except ValueError as exc:
        raise InputError(f"not a PROTEUS_REPORT file (not JSON: {exc})", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("kernels"), list):
        raise InputError("not a PROTEUS_REPORT file (no kernel list)", path)
    return doc


@main.command(epilog=EPILOG)
@click.argument("report_file", metavar="REPORT", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the per-kernel summary as JSON.")
def report(report_file, as_json):
    """Summarize a PROTEUS_REPORT file: per kernel, how its launches ran and what it cost.

    The report is written at exit by a run under the shim with PROTEUS_REPORT=FILE. Columns:
    launches; specialized, the share that ran a specialized variant; variants compiled in the
    run and served from the memory and disk caches; compile ms; launches that ran the
    original kernel while a variant compiled in the background, because the compile
    budget was spent, or after a failure; and the arguments the value tracker stopped folding.
    """
    doc = _read_report(report_file)
    rows = []
    try:
        for k in doc["kernels"]:
            launches = int(k.get("launches", 0))
            tracker = k.get("tracker") or {}
            rows.append({
                "kernel": k.get("demangled") or k["name"],
                "launches": launches,
                "specialized": int(k.get("specialized_launches", 0)),
                "compiled": int(k.get("specializations", 0)),
                "memory_hits": int(k.get("memory_cache_hits", 0)),
                "disk_hits": int(k.get("disk_cache_hits", 0)),
                "compile_ms": float(k.get("compile_ms", 0.0)),
                "while_compiling": int(k.get("launches_while_compiling", 0)),
                "budget_refusals": int(k.get("budget_refusals", 0)),
                "fallbacks": int(k.get("fallback_launches", 0)),
                "failures": dict(k.get("failures") or {}),
                "unfolded_by_tracker": list(tracker.get("stopped_folding", [])),
                "not_compiled": len(k.get("not_compiled") or []),
            })
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"not a PROTEUS_REPORT file ({type(exc).__name__}: {exc})", report_file) from None
    waits = doc.get("shim_wait_ms") if isinstance(doc.get("shim_wait_ms"), dict) else {}
    threads = doc.get("threads_ms") if isinstance(doc.get("threads_ms"), dict) else {}
    threads = {k: v for k, v in threads.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    proc = doc.get("compiler_process") if isinstance(doc.get("compiler_process"), dict) else None
    if as_json:
        click.echo(json.dumps({"report": report_file, "shim_wait_ms": waits, "prestart": doc.get("prestart") or {},
                               "threads_ms": threads, "compiler_process": proc, "kernels": rows}, indent=2))
        return
    head = [f"{doc.get('tool', 'proteus-rewrite')}, pid {doc.get('pid', '?')}, {doc.get('seconds', '?')} s"]
    if doc.get("python") is False:
        head.append("Python never started" + (" (PROTEUS_DISABLE)" if doc.get("disabled") else ""))
    if doc.get("unknown_handle_launches"):
        head.append(f"{doc['unknown_handle_launches']} launches of kernels the shim never saw registered")
    click.echo("; ".join(head))
    if waits:
        pre = doc.get("prestart") if isinstance(doc.get("prestart"), dict) else {}
        n = waits.get("miss_count", 0)
        kept = waits.get("deferred_count", 0)
        line = (f"the app waited on the shim {waits.get('misses', 0)} ms over {n:,} miss{'es' if n != 1 else ''} "
                + (f"({kept:,} kept for the value tracker, with no call into Python) " if isinstance(kept, int) and kept else "")
                + f"and {waits.get('exit', 0)} ms at exit; Python started in {waits.get('python_start', 0)} ms "
                + ("on the prestart thread, beside the app" if pre.get("python") else "on the first launch that missed (part of that wait)"))
        if pre.get("compiler"):
            line += "; the compiler process was started there" if proc else "; the compiler was warmed up there too"
        elif waits.get("prepare_compiler"):
            line += f"; compiler warm-up on an app thread: {waits['prepare_compiler']} ms"
        if waits.get("compiling_count"):
            n = waits["compiling_count"]
            line += (f"; {n:,} launch{'es' if n != 1 else ''} waited {waits.get('compiling', 0)} ms in all for a variant "
                     "compiling in the background, the GPU busy meanwhile")
        click.echo(line)
    if proc and proc.get("deaths"):
        click.echo(f"{proc['deaths']} compiler process(es) died; their variants ran the original kernels")
    if threads.get("app_main_wall"):  # the shim wrapped main: the app's own time against the shim's threads'
        click.echo(f"main() ran {threads['app_main_wall']} ms ({threads.get('app_main_cpu', 0)} ms of its thread's CPU); "
                   f"the compile threads used {threads.get('compile_threads_cpu', 0)} ms of CPU and the prestart thread "
                   f"{threads.get('prestart_cpu', 0)} ms, beside it")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, right in (("kernel", False), ("launches", True), ("specialized", True), ("compiled", True),
                       ("mem/disk hits", True), ("compile ms", True), ("original ran: compiling / budget / other", True),
                       ("tracker unfolded", False)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in rows:
        share = f"{100.0 * r['specialized'] / r['launches']:.1f}%" if r["launches"] else "-"
        other = r["fallbacks"] - r["while_compiling"] - r["budget_refusals"]
        t.add_row(r["kernel"], f"{r['launches']:,}", share, str(r["compiled"]), f"{r['memory_hits']}/{r['disk_hits']}",
                  f"{r['compile_ms']:.1f}", f"{r['while_compiling']:,} / {r['budget_refusals']:,} / {max(other, 0):,}",
                  ", ".join(map(str, r["unfolded_by_tracker"])) or "-")
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(t)
    for r in rows:
        for reason, n in r["failures"].items():
            click.echo(f"{r['kernel']}: {n} x {reason}")
        if r["not_compiled"]:
            click.echo(f"{r['kernel']}: {r['not_compiled']} variant(s) queued but never compiled (the tracker moved "
                       "past them, or the run ended first); `proteus-rewrite prewarm` compiles what the next run needs")


def _store_path(path: str) -> str:
    """A directory written by proteus-rewrite stands for the .kstore inside it."""
    if os.path.isdir(path):
        found = sorted(Path(path).glob(f"*{store.SUFFIX}"))
        if len(found) != 1:
            raise ProteusError(f"expected one {store.SUFFIX} file in the directory, found {len(found)}", path)
        return str(found[0])
    return path


@main.group()
def cache():
    """The on-disk JIT cache (PROTEUS_CACHE_DIR, default: the user cache directory)."""


def _storage(directory: str | None):
    from .cache import StorageCache
    from .jit import Config

    cfg = Config.from_env()
    return StorageCache(directory or cfg.cache_dir, cfg.cache_max_mb)


_dir_option = click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=str),
                           help="Cache directory (default: PROTEUS_CACHE_DIR or the user cache directory).")


@cache.command("ls")
@_dir_option
@click.option("--json", "as_json", is_flag=True)
def cache_ls(directory, as_json):
    """List the cached kernels, most recently used first."""
    from .cache import describe

    store = _storage(directory)
    rows = [describe(p) for p, _ in sorted(store.entries(), key=lambda e: -e[1].st_mtime)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    grid = Table(show_edge=False, header_style="bold")
    for col in ("key", "kernel", "kind", "arch", "bytes", "compile ms", "last used"):
        grid.add_column(col)
    for r in rows:
        if "error" in r:
            grid.add_row(r["file"], f"[red]{r['error']}[/]", "", "", "", "", "")
        else:
            grid.add_row(r["key"][:16], kernels_mod.demangle(r["kernel"]), r["kind"], arch_name(r["arch"]), f"{r['bytes']:,}",
                         f"{r['compile_ms']:.1f}" if r["compile_ms"] is not None else "", r["last_used"])
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(grid)
    click.echo(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'} in {store.dir}")


@cache.command("stats")
@_dir_option
def cache_stats(directory):
    """Entries, size and cap of the cache."""
    store = _storage(directory)
    entries = store.entries()
    total = sum(st.st_size for _, st in entries)
    click.echo(f"directory  {store.dir}")
    click.echo(f"entries    {len(entries)}")
    click.echo(f"size       {total / 1e6:.2f} MB of {store.max_bytes / 2**20:g} MiB (PROTEUS_CACHE_MAX_MB)")


@cache.command("clear")
@_dir_option
def cache_clear(directory):
    """Delete every cached kernel."""
    store = _storage(directory)
    n = store.clear()
    click.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} from {store.dir}")


def _arch(text: str) -> int | str:
    """sm_90 -> 90 (CUDA); gfx90a -> "gfx90a" (HIP: an AMDGPU processor, features dropped)."""
    t = text.lower()
    if t.startswith("gfx") and t[3:].split(":", 1)[0].isalnum():
        return t.split(":", 1)[0]
    t = t.removeprefix("sm_").removeprefix("sm")
    if not t.isdigit():
        raise click.BadParameter(f"{text!r}: expected sm_XX (e.g. sm_90) or an AMDGPU processor (e.g. gfx90a)",
                                 param_hint="--arch")
    return int(t)


def _default_arch(table: KernelTable, name: str) -> str:
    """A HIP kernel's first processor with bitcode (each is built for a few; none is 'newest')."""
    archs = [k.arch for k in _matching(table, name) if k.has_bitcode]
    return str(archs[0]) if archs else "gfx90a"


def _dim3(text: str, hint: str) -> tuple[int, int, int]:
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 1 for p in parts):
        raise click.BadParameter(f"{text!r}: expected X[,Y,Z] of positive integers", param_hint=hint)
    return tuple((parts + [1, 1])[:3])  # type: ignore[return-value]


def _matching(table: KernelTable, name: str) -> list:
    matches = [k for k in table.kernels if name in (k.name, k.demangled)]
    if not matches:
        matches = [k for k in table.kernels if k.demangled.startswith(name) or _base_name(k.demangled) in (name, name.split("<")[0])]
    if not matches:
        raise click.BadParameter(f"no kernel {name!r}; kernels: " + ", ".join(sorted({k.demangled for k in table.kernels})),
                                 param_hint="KERNEL")
    if len({k.name for k in matches}) > 1:
        raise click.BadParameter(f"{name!r} is ambiguous: " + ", ".join(sorted({k.demangled for k in matches})), param_hint="KERNEL")
    return matches


def _base_name(demangled: str) -> str:
    """A kernel's name without return type, template arguments or parameters:
    `void tile_sums<16>(float const*)` -> tile_sums."""
    head = demangled.split("(")[0]
    depth, out = 0, ""
    for c in head:  # drop template argument lists, which may hold spaces
        depth += c == "<"
        if depth == 0:
            out += c
        depth -= c == ">"
    return out.split(" ")[-1].split("::")[-1]


def _find_kernel(table: KernelTable, name: str, arch: int | str):
    matches = _matching(table, name)
    best = best_for_arch(matches, arch)
    if best is None:
        built = sorted({arch_name(k.arch) for k in matches if k.has_bitcode})
        if built:  # HIP: the processor must be one it was built for
            raise NoBitcodeError(f"kernel {matches[0].demangled} has no recorded bitcode for {arch_name(arch)} "
                                 f"(it has for {', '.join(built)})")
        raise NoBitcodeError(f"kernel {matches[0].demangled} has no recorded bitcode")
    return best


def _write_atomic(path: str, data: bytes) -> None:
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _extract(app: str, data: bytes) -> KernelTable:
    def build(progress=None) -> KernelTable:
        try:
            return kernels_mod.build(data, app, progress)
        except ProteusError as exc:
            exc.path = exc.path or app
            raise

    if not sys.stderr.isatty():
        return build()
    from rich.progress import Progress

    with Progress(transient=True, console=err_console) as progress:
        task = progress.add_task(f"reading {os.path.basename(app)}", total=None)
        return build(lambda done, total: progress.update(task, completed=done, total=total))


def _load(path: str) -> KernelTable:
    data = kernels_mod.read_input(path)
    if data[: len(store.MAGIC)] == store.MAGIC:
        return store.deserialize(data, path)
    try:
        return kernels_mod.build(data, path)
    except ProteusError as exc:
        exc.path = exc.path or path
        raise


def _require_bitcode(table: KernelTable, app: str) -> None:
    if not table.kernels:
        raise NoBitcodeError("the fat binaries hold no kernels", app)
    if not table.kernels_with_bitcode and table.app.platform == "hip":
        raise NoBitcodeError(
            f"none of its {len(table.kernels)} kernels carries LLVM bitcode (built without -fembed-bitcode?); "
            "rebuild with clang: clang++ -x hip --offload-arch=gfxXXX -fembed-bitcode ... (docs/hip.md)",
            app,
        )
    if not table.kernels_with_bitcode:
        raise NoBitcodeError(
            f"none of its {len(table.kernels)} kernels carries LLVM bitcode (built by nvcc, or without "
            "embedded bitcode?); rebuild with clang: clang++ -x cuda --cuda-gpu-arch=sm_XX -Xclang -fembed-bitcode=all ...",
            app,
        )


def table_to_json(table: KernelTable) -> dict:
    return {
        "tool": f"proteus-rewrite {__version__}",
        "app": dataclasses.asdict(table.app),
        "fatbins": [dataclasses.asdict(f) for f in table.fatbins],
        "modules": [
            {k: v for k, v in dataclasses.asdict(m).items() if k != "bitcode"}
            | {"size": m.size, "recipe": dataclasses.asdict(m.recipe)}
            for m in table.modules
        ],
        "kernels": [dataclasses.asdict(k) | {"has_bitcode": k.has_bitcode} for k in table.kernels],
        "warnings": list(table.warnings),
    }


def _print_table(table: KernelTable) -> None:
    # Piped output keeps one kernel per line rather than wrapping at 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
    a = table.app
    runtime = "hip" if a.platform == "hip" else f"cudart: {a.cudart}"
    console.print(f"[bold]{a.name}[/]  {a.size:,} bytes  {a.file_type}{' PIE' if a.pie else ''}"
                  f"{' stripped' if a.stripped else ''}  {runtime}{'  -fgpu-rdc' if a.rdc else ''}")
    if a.rewritten:
        console.print(f"  rewritten by {a.rewritten.get('tool', '?')} on {a.rewritten.get('rewritten', '?')} "
                      f"from {a.rewritten.get('original_name', '?')} (sha256 {str(a.rewritten.get('original_sha256', '?'))[:16]}...)")
    for f in table.fatbins:
        entries = ", ".join(f"{e.kind} {arch_name(e.arch)}{'' if e.compression == 'none' else ' ' + e.compression}" for e in f.entries)
        console.print(f"  fatbin {f.index}: {f.size:,} bytes at {f.section}+{f.offset:#x}: {entries}")
    for m in table.modules:
        r = m.recipe
        how = "" if r.name == "unknown" else f", built with {r.name}, embedded {r.embedded}"
        console.print(f"  module {m.index}: {m.size:,} bytes of bitcode, {arch_name(m.arch)}, "
                      f"{os.path.basename(m.source_filename) or '?'}{how}")
    grid = Table(show_edge=False, header_style="bold")
    for col in ("kernel", "arch", "parameters", "bytes", "bitcode", "globals", "launch bounds"):
        grid.add_column(col, overflow="fold", no_wrap=col in ("arch", "bytes"))
    for k in table.kernels:
        params = ", ".join(_param_text(p) for p in k.params)
        bounds = ""
        if k.max_threads:
            bounds = "x".join(str(d) for d in k.max_threads) + (f", min {k.min_ctas}/SM" if k.min_ctas else "")
        grid.add_row(
            k.demangled + (f"  [dim]jit{list(k.jit_args)}[/]" if k.jit_args is not None else ""),
            arch_name(k.arch),
            params,
            str(k.param_size),
            f"module {k.module}" + (f" +{list(k.link_modules)}" if k.link_modules else "") if k.has_bitcode else "[red]none[/]",
            ", ".join(k.globals),
            bounds,
        )
    console.print(grid)
    n, nb = len(table.kernels), len(table.kernels_with_bitcode)
    console.print(f"{n} kernel(s), {nb} with bitcode")


def _param_text(p) -> str:
    t = p.llvm_type or "?"
    return f"{t}:{p.size}" if p.kind in ("aggregate", "unknown") else t


def run() -> None:
    """Console-script entry point: ProteusErrors become one line and their exit code, never a traceback."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except ProteusError as exc:
        err_console.print(f"proteus-rewrite: error: {exc}", markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for PROTEUS_DEBUG=1
        if os.environ.get("PROTEUS_DEBUG"):
            raise
        err_console.print(
            f"proteus-rewrite: internal error: {type(exc).__name__}: {exc} (set PROTEUS_DEBUG=1 for a traceback)",
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    run()
