"""proteus-rewrite job-summary: the PROTEUS_REPORT files of a job's ranks, merged into one summary."""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass

import click
from rich.console import Console
from rich.table import Table

from ..errors import InputError
from ..runtime.report import read_report
from .app import EPILOG, main

# A report's "claims" (runtime/report.py claim_counters), by the names this summary shows; the
# others are names the cache's counters may carry.
CLAIM_FIELDS = {
    "won": ("won", "claims_won"),
    "lost": ("lost", "claims_lost"),
    "broken": ("broken", "claims_broken"),
    "wait_s": ("wait_s", "wait_seconds", "claim_wait_s"),
    "shared_hits": ("shared_hits", "hits_shared"),
    "write_failures": ("write_failures", "shared_write_failures"),
}


@dataclass
class RankRow:
    """One report of the job."""

    file: str
    rank: int | None  # None: the report has none (run outside a parallel launch, or an older report)
    pid: int | None
    launches: int
    specialized: int
    compiled: int
    won: int
    lost: int
    broken: int
    wait_s: float
    shared_hits: int
    write_failures: int


def report_files(patterns: tuple[str, ...]) -> list[str]:
    """The files named: each argument a file, a glob (run.*.json) or a PROTEUS_REPORT template
    (run.%r.json, its %r and %p standing for any text); a pattern that matches nothing is an
    InputError naming it."""
    files: list[str] = []
    for pattern in patterns:
        as_glob = re.sub(r"%[rp]", "*", pattern).replace("%%", "%")
        if as_glob == pattern and not glob.has_magic(pattern):
            files.append(pattern)  # read_report says what is wrong with it
            continue
        found = sorted(glob.glob(as_glob), key=_natural)
        if not found:
            raise InputError("no file matches", pattern)
        files += found
    return list(dict.fromkeys(files))


def _natural(path: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def _count(value: object, what: str, path: str, number: type = int) -> int | float:
    if value is None:
        return number(0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InputError(f"not a PROTEUS_REPORT file ({what} is {value!r}, not a count)", path)
    return number(value)


def rank_row(doc: dict, path: str) -> tuple[RankRow, set[str], set[str]]:
    """A report's row, the cache keys of the variants it used, and of those it compiled."""
    kernels = [k for k in doc["kernels"] if isinstance(k, dict)]
    if len(kernels) != len(doc["kernels"]):
        raise InputError("not a PROTEUS_REPORT file (a kernel is not an object)", path)
    claims = doc.get("claims") or {}
    if not isinstance(claims, dict):
        raise InputError("not a PROTEUS_REPORT file (its claims are not an object)", path)

    def claim(field: str, number: type = int):
        value = next((claims[n] for n in CLAIM_FIELDS[field] if n in claims), 0)
        return _count(value, f"claims.{field}", path, number)

    rank = doc.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise InputError(f"not a PROTEUS_REPORT file (its rank is {rank!r})", path)
    keys: set[str] = set()
    compiled: set[str] = set()
    for k in kernels:
        for v in k.get("variants") or []:
            if isinstance(v, dict) and isinstance(v.get("cache_key"), str):
                keys.add(v["cache_key"])
                if v.get("source") == "compiled":
                    compiled.add(v["cache_key"])
    pid = doc.get("pid")
    row = RankRow(
        file=path, rank=rank, pid=pid if isinstance(pid, int) else None,
        launches=sum(_count(k.get("launches"), "a kernel's launches", path) for k in kernels),
        specialized=sum(_count(k.get("specialized_launches"), "a kernel's specialized_launches", path) for k in kernels),
        compiled=sum(_count(k.get("specializations"), "a kernel's specializations", path) for k in kernels),
        won=claim("won"), lost=claim("lost"), broken=claim("broken"), wait_s=claim("wait_s", float),
        shared_hits=claim("shared_hits"), write_failures=claim("write_failures"))
    return row, keys, compiled


def summarize(files: list[str]) -> dict:
    """The job's summary: per report its row, the totals, and the distinct variant keys against
    the compilations (more compilations than keys: ranks compiled the same variant twice)."""
    rows, keys, compiled_by = [], set(), {}
    for path in files:
        row, used, compiled = rank_row(read_report(path), path)
        rows.append(row)
        keys |= used
        for key in compiled:
            compiled_by[key] = compiled_by.get(key, 0) + 1
    rows.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, _natural(r.file)))
    ranks = [r.rank for r in rows if r.rank is not None]
    totals = {f: sum(getattr(r, f) for r in rows) for f in
              ("launches", "specialized", "compiled", "won", "lost", "broken", "wait_s", "shared_hits", "write_failures")}
    totals["wait_s"] = round(totals["wait_s"], 3)
    return {
        "reports": len(rows),
        "ranks": sorted(set(ranks)),
        "duplicate_ranks": sorted({r for r in ranks if ranks.count(r) > 1}),
        "without_rank": sum(1 for r in rows if r.rank is None),
        "totals": totals,
        "specialized_share": round(totals["specialized"] / totals["launches"], 4) if totals["launches"] else None,
        "distinct_variant_keys": len(keys),
        "compilations": totals["compiled"],
        # compilations of a variant another report compiled too (claims lost to a dead holder, a
        # tier that failed, ranks of several runs)
        "compiled_again": sum(n - 1 for n in compiled_by.values()),
        "per_rank": [asdict(r) for r in rows],
    }


def _spread(values: list) -> str:
    if len(values) < 2:
        return "-"
    if any(isinstance(v, float) for v in values):
        return " / ".join(f"{v:.2f}" for v in (min(values), statistics.median(values), max(values)))
    median = statistics.median(values)  # of an even count: may fall between two
    return f"{min(values):,} / {median:,.0f} / {max(values):,}" if median == int(median) else \
        f"{min(values):,} / {median:,.1f} / {max(values):,}"


@main.command("job-summary", epilog=EPILOG)
@click.argument("reports", metavar="REPORT...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary, with a row per report, as JSON.")
def job_summary(reports, as_json):
    """Merge the PROTEUS_REPORT files of a job's ranks into one summary.

    REPORT: files, globs (`'run.*.json'`) or the PROTEUS_REPORT template the job used
    (`run.%r.json`: its %r and %p match any rank or pid). Shown: the ranks; launches and the
    share specialized; variants compiled (in all and per rank: min / median / max); the shared
    tier's compile claims won, lost and broken (a holder that died), seconds waited on others'
    claims, variants found in the shared tier, and writes to it that failed; and the distinct
    variant keys against the compilations, with those of a variant another rank compiled too.
    """
    doc = summarize(report_files(reports))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    rows, totals = doc["per_rank"], doc["totals"]
    ranks = doc["ranks"]
    head = f"{doc['reports']} report{'s' if doc['reports'] != 1 else ''}"
    if ranks:
        contiguous = ranks == list(range(ranks[0], ranks[-1] + 1))
        head += f", ranks {ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else \
            f", rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    if doc["without_rank"]:
        head += f", {doc['without_rank']} without a rank (no launcher's rank variable was set)"
    click.echo(head)
    if doc["duplicate_ranks"]:
        click.echo(f"more than one report of rank {', '.join(map(str, doc['duplicate_ranks']))}: "
                   "several runs' reports, or a PROTEUS_REPORT without %r")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, right in (("", False), ("job", True), ("per rank: min / median / max", True)):
        t.add_column(col, justify="right" if right else "left")
    share = f" ({100.0 * doc['specialized_share']:.1f}%)" if doc["specialized_share"] is not None else ""
    for label, field, total in (
            ("launches", "launches", f"{totals['launches']:,}"),
            ("specialized", "specialized", f"{totals['specialized']:,}{share}"),
            ("compiled", "compiled", f"{totals['compiled']:,}"),
            ("claims won", "won", f"{totals['won']:,}"),
            ("claims lost", "lost", f"{totals['lost']:,}"),
            ("claims broken", "broken", f"{totals['broken']:,}"),
            ("claim wait s", "wait_s", f"{totals['wait_s']:.2f}"),
            ("shared hits", "shared_hits", f"{totals['shared_hits']:,}"),
            ("write failures", "write_failures", f"{totals['write_failures']:,}")):
        t.add_row(label, total, _spread([r[field] for r in rows]))
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(t)
    keys, compiled, again = doc["distinct_variant_keys"], doc["compilations"], doc["compiled_again"]
    click.echo(f"variants: {keys:,} distinct key{'s' if keys != 1 else ''}, {compiled:,} compilation"
               f"{'s' if compiled != 1 else ''} in all ranks"
               + (f"; {again:,} of a variant another rank compiled too" if again else ""))
