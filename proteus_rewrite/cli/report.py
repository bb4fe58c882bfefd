"""proteus-rewrite report: a PROTEUS_REPORT file, per kernel."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from ..runtime.report import kernel_rows, read_report
from .app import EPILOG, main
from .common import input_path


@main.command(epilog=EPILOG)
@click.argument("report_file", metavar="REPORT", type=input_path())
@click.option("--json", "as_json", is_flag=True, help="Print the per-kernel summary as JSON.")
def report(report_file, as_json):
    """Summarize a PROTEUS_REPORT file: per kernel, how its launches ran and what it cost.

    The report is written at exit by a run under the shim with PROTEUS_REPORT=FILE. Columns:
    launches; specialized, the share that ran a specialized variant; variants compiled in the
    run and served from the memory and disk caches; compile ms; launches that ran the
    original kernel while a variant compiled in the background, because the compile
    budget was spent, or otherwise (a failure, a variant found slower, the original's turns in a
    speed trial); the kernel's GPU time against the original's, from the speed trials (below 1:
    its variants won), and in words: variants kept, found slower and dropped, or not yet judged
    and why; and the arguments the value tracker stopped folding.
    """
    doc = read_report(report_file)
    rows = [vars(r) for r in kernel_rows(doc, report_file)]
    waits = doc.get("shim_wait_ms") if isinstance(doc.get("shim_wait_ms"), dict) else {}
    threads = doc.get("threads_ms") if isinstance(doc.get("threads_ms"), dict) else {}
    threads = {k: v for k, v in threads.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    proc = doc.get("compiler_process") if isinstance(doc.get("compiler_process"), dict) else None
    if as_json:
        click.echo(json.dumps({"report": report_file, "shim_wait_ms": waits, "prestart": doc.get("prestart") or {},
                               "threads_ms": threads, "compiler_process": proc, "kernels": rows}, indent=2))
        return
    head = [f"{doc.get('tool', 'proteus-rewrite')}, pid {doc.get('pid', '?')}, {doc.get('seconds', '?')} s"]
    if doc.get("no_gpu"):
        head.append(f"no usable GPU ({doc['no_gpu']}): nothing was specialized")
    elif doc.get("python") is False:
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
                + ("on the prestart thread, beside the app" if pre.get("python")
                   else "on the first launch that missed (part of that wait)"))
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
                       ("time vs original", True), ("speed trials", False), ("checks", False),
                       ("tracker unfolded", False)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in rows:
        share = f"{100.0 * r['specialized'] / r['launches']:.1f}%" if r["launches"] else "-"
        other = r["fallbacks"] - r["while_compiling"] - r["budget_refusals"]
        t.add_row(r["kernel"], f"{r['launches']:,}", share, str(r["compiled"]), f"{r['memory_hits']}/{r['disk_hits']}",
                  f"{r['compile_ms']:.1f}", f"{r['while_compiling']:,} / {r['budget_refusals']:,} / {max(other, 0):,}",
                  f"{r['time_vs_original']:.2f}x" if r["time_vs_original"] else "-", r["verdict"], r["checks"],
                  ", ".join(map(str, r["unfolded_by_tracker"])) or "-")
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(t)
    for r in rows:
        for reason, n in r["failures"].items():
            click.echo(f"{r['kernel']}: {n} x {reason}")
        if r["slower"]:
            click.echo(f"{r['kernel']}: {r['slower']} variant(s) timed slower than the original kernel; their launches "
                       "ran the original (PROTEUS_SPEED_CHECK)")
        if r["not_compiled"]:
            click.echo(f"{r['kernel']}: {r['not_compiled']} variant(s) queued but never compiled (the tracker moved "
                       "past them, or the run ended first); `proteus-rewrite prewarm` compiles what the next run needs")


