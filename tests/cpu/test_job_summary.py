"""`proteus-rewrite job-summary`: the reports of a job's ranks, written by the run time's own
report writer under PROTEUS_REPORT=run.%r.json, merged into one summary; and bad input, one
line naming the file, exit 3 (issue #52)."""

from __future__ import annotations

import json

import pytest

from proteus_rewrite import jobenv, runtime
from proteus_rewrite.jit.launch import parse_value
from proteus_rewrite.runtime import protocol

from ..conftest import run_cli
from ..support.launches import runtime_over
from .test_exit_codes import one_line

CLAIMS = [{"won": 1, "lost": 0, "broken": 0, "wait_s": 0.0, "shared_hits": 0, "write_failures": 0},
          {"won": 1, "lost": 1, "broken": 1, "wait_s": 1.5, "shared_hits": 1, "write_failures": 2}]


@pytest.fixture(scope="module")
def job(samples, tmp_path_factory):
    """Two ranks of loop_count sharing one cache directory, as the run time writes their
    reports: rank 0 compiles axpy_loop for iters=3; rank 1 finds that one in the cache and
    compiles iters=4. Their claim counters are the cache's (stood in for here)."""
    tmp = tmp_path_factory.mktemp("job")
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp / "out")).returncode == 0
    mp = pytest.MonkeyPatch()
    mp.setenv("PROTEUS_CACHE_DIR", str(tmp / "cache"))
    mp.setenv("PROTEUS_COMPILE_PROCESS", "0")
    for name in jobenv.RANK_VARIABLES:
        mp.delenv(name, raising=False)
    try:
        for rank, values in ((0, ("3",)), (1, ("3", "4"))):
            mp.setenv("SLURM_PROCID", str(rank))
            st, _t, k = runtime_over(tmp / "out", "axpy_loop")
            for n in values:
                args = b"".join(parse_value(p, n) if p.index == 1 else bytes(p.size) for p in k.params)
                assert runtime.specialize(0, args, (4, 1, 1), (256, 1, 1), b"", 90) is not None
            st.cache.claim_stats = CLAIMS[rank]
            # 100 launches, 10 of them the original's (while compiling)
            counters = protocol.COUNTERS.pack(0, 100, 90, 0, 0, 10, 0, 0, 1000, 0, 0) + k.name.encode() + b"\0"
            runtime.write_report(str(tmp / "run.%r.json"), counters)
    finally:
        runtime.reset()
        mp.undo()
    return tmp


def test_the_runtime_writes_one_report_per_rank(job):
    docs = [json.loads((job / f"run.{r}.json").read_text()) for r in (0, 1)]
    assert [d["rank"] for d in docs] == [0, 1]
    assert [d["claims"] for d in docs] == CLAIMS
    assert [d["kernels"][0]["specializations"] for d in docs] == [1, 1]


def test_the_summary_merges_the_ranks(job):
    proc = run_cli("job-summary", str(job / "run.%r.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["reports"] == 2 and doc["ranks"] == [0, 1] and doc["duplicate_ranks"] == [] and doc["without_rank"] == 0
    t = doc["totals"]
    assert (t["launches"], t["specialized"], t["compiled"]) == (200, 180, 2)
    assert (t["won"], t["lost"], t["broken"], t["wait_s"], t["shared_hits"], t["write_failures"]) == (2, 1, 1, 1.5, 1, 2)
    assert doc["specialized_share"] == 0.9
    # rank 1 took iters=3 from the cache: two keys, two compilations, none twice
    assert (doc["distinct_variant_keys"], doc["compilations"], doc["compiled_again"]) == (2, 2, 0)
    assert [r["rank"] for r in doc["per_rank"]] == [0, 1]


def test_the_table(job):
    proc = run_cli("job-summary", str(job / "run.*.json"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("2 reports, ranks 0-1")
    for row in ("launches", "specialized", "compiled", "claims won", "claims lost", "claims broken", "claim wait s",
                "shared hits", "write failures"):
        assert row in out, row
    assert "180 (90.0%)" in out
    assert "variants: 2 distinct keys, 2 compilations in all ranks" in out


def test_the_same_variant_compiled_by_two_ranks_is_counted_and_a_report_without_rank_is_kept(job, tmp_path):
    doc = json.loads((job / "run.0.json").read_text())
    (tmp_path / "run.0.json").write_text(json.dumps(doc))
    again = dict(doc, rank=3, pid=1)
    (tmp_path / "run.3.json").write_text(json.dumps(again))
    # the shim's own report, when Python never started: no rank, no claims, no variants
    (tmp_path / "run.77.json").write_text(json.dumps({"pid": 77, "python": False, "kernels": [
        {"name": "k", "launches": 5, "specialized_launches": 0}]}))
    proc = run_cli("job-summary", str(tmp_path / "run.0.json"), str(tmp_path / "run.[37]*.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ranks"] == [0, 3] and out["without_rank"] == 1
    assert (out["distinct_variant_keys"], out["compilations"], out["compiled_again"]) == (1, 2, 1)
    assert out["totals"]["launches"] == 205
    table = run_cli("job-summary", str(tmp_path / "run.*.json")).stdout
    assert "1 without a rank" in table and "1 of a variant another rank compiled too" in table


def test_two_reports_of_one_rank_are_pointed_out(job, tmp_path):
    doc = (job / "run.1.json").read_text()
    (tmp_path / "a.json").write_text(doc)
    (tmp_path / "b.json").write_text(doc)
    proc = run_cli("job-summary", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert proc.returncode == 0, proc.stderr
    assert "more than one report of rank 1" in proc.stdout


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read: No such file"),
    ("not json", "not JSON"),
    ('{"pid": 1}', "no kernel list"),
    ('{"kernels": [{"launches": "many"}]}', "launches is 'many'"),
    ('{"kernels": [], "claims": {"won": "yes"}}', "claims.won is 'yes'"),
    ('{"kernels": [], "claims": [1]}', "claims are not an object"),
    ('{"kernels": [], "rank": "zero"}', "its rank is 'zero'"),
    ('{"kernels": [3]}', "a kernel is not an object"),
])
def test_bad_input_is_one_line_naming_the_file_and_exit_3(job, tmp_path, content, why):
    bad = tmp_path / "run.9.json"
    if content is not None:
        bad.write_text(content)
    proc = run_cli("job-summary", str(job / "run.0.json"), str(bad))
    assert proc.returncode == 3
    assert why in one_line(proc, str(bad))


def test_a_pattern_that_matches_nothing_is_exit_3(tmp_path):
    proc = run_cli("job-summary", str(tmp_path / "run.%r.json"))
    assert proc.returncode == 3
    assert "no file matches" in one_line(proc, "run.%r.json")


def test_no_report_is_a_usage_error():
    proc = run_cli("job-summary")
    assert proc.returncode == 2
    one_line(proc, "REPORT")
