"""bench/policy_bench.py and bench/pool_policy.py on the CPU: their tables, the modes'
environments, --render, and what they say about missing builds or files."""

from __future__ import annotations

import json

from bench import policy_bench as pb
from bench import pool_policy as pp


def test_policy_bench_tables_and_missing_builds(tmp_path, monkeypatch, capsys):
    doc = {"environment": {"gpu": "H100"}, "date": "2026-11-23", "command": "python3 bench/policy_bench.py",
           "changing_scalars": {"step counter": {"args": ["20000", "20000", "1"],
                                                 "modes": {"native": {"median": 1.5}, "cold": {"median": 1.55},
                                                           "cold, sync": {}, "warm": {"median": 1.52}},
                                                 "speedup": {"cold": 0.97, "warm": 0.99},
                                                 "mismatches": [{"mode": "cold, sync"}],
                                                 "paired": {"cold": {"median": 0.96, "ci95": [0.94, 0.99], "n": 9}},
                                                 "segments_ms": {"warm": {"to_shim": 2.0, "static_init": 10.0, "main": 800.0,
                                                                          "exit_handlers": 1.5, "teardown": 85.5}},
                                                 "split": {"cold": {"context_s": 0.25, "work_s": 0.4, "launch_calls_s": 0.09,
                                                                    "host_compute_s": 0.3, "slow_launches": 3.5,
                                                                    "slow_launches_s": 0.0045, "longest_launch_s": 0.00225}},
                                                 "paired_phases": {"work_s": {"cold": {"median": 0.99, "ci95": [0.98, 1.0], "n": 9}}},
                                                 "shim": {"cold": {"wait_ms": {"misses": 1.2}, "misses": 12, "deferred": 10},
                                                          "warm": {"wait_ms": {"python_start": 90.0, "misses": 1.5,
                                                                               "prepare_compiler": 0.0, "exit": 0.0},
                                                                   "misses": 1, "variants_compiled": 0, "disk_hits": 1,
                                                                   "specialized_share": 1.0,
                                                                   "threads_ms": {"app_main_wall": 700.0, "app_main_cpu": 650.5,
                                                                                  "compile_threads_cpu": 0.0, "prestart_cpu": 310.0,
                                                                                  "after_main": 2.5}}},
                                                 "usage": {"native": {"user_s": 0.7, "sys_s": 0.2, "voluntary_switches": 40,
                                                                      "involuntary_switches": 3},
                                                           "warm": {"user_s": 1.1, "sys_s": 0.3, "voluntary_switches": 90,
                                                                    "involuntary_switches": 5}},
                                                 "cold_report": {"specializations": 10, "specialized_launches": 20000,
                                                                 "launches": 20000}}},
           "workloads": {"adam": {"modes": {"native": {"median": 1.8}}, "speedup": {"cold": 0.95, "prewarmed": 1.08},
                                  "paired": {"prewarmed": {"median": 1.07, "ci95": [1.02, 1.1], "n": 5}},
                                  "prewarm_s": 2.5, "mismatches": [{"mode": "cold"}]},
                         "wsm5": {"error": "native run failed: exit 1"}}}
    md = pb.markdown(doc)
    assert "| step counter (20000 20000 1) | cold | 1.5 | 0.97× | 0.96× [0.94–0.99] | — / 0.99× [0.98–1.0] | — | — | 0 |" in md
    assert "| step counter (20000 20000 1) | cold, sync | 1.5 | — | — | — / — | — | — | 1 |" in md
    assert "| step counter (20000 20000 1) | warm | 1.5 | 0.99× | — | — / — | 0 | 100.0% | 0 |" in md
    assert "| step counter | warm | 1.5 | 1 | — | 0; 0 | 90.0 | 0.0 | 0.0 | 0 | 1 | 100.0% |" in md
    assert "| step counter | cold | 1.2 | 12 (10) | — |" in md  # 10 of the 12 kept for the tracker
    assert "| step counter (20000 20000 1) | cold, async |" not in md  # a mode not run has no row
    assert "| step counter | native | 0.7 | 0.2 | 40 / 3 | — | — | — | — | — |" in md  # no shim, no threads
    assert "| step counter | warm | 2.0 | 10.0 | 800.0 | 1.5 | 85.5 |" in md
    assert "| step counter | cold | 250.0 | 400.0 | 90.0 | 300.0 | 3.5 | 4.50 | 2.25 |" in md
    assert "| step counter | warm | 1.1 | 0.3 | 90 / 5 | 700.0 | 650.5 | 0.0 | 310.0 | 2.5 |" in md
    assert "| adam | 1.8 | 0.95×; — | —; — | —; — | 1.08×; 1.07× [1.02–1.1] | 2.5 | 1 |" in md
    assert "| wsm5 | native run failed" in md
    walls = {i: {"native": 1.0, "cold": 1.0 / r} for i, r in enumerate((0.9, 1.0, 1.1, 1.0, 1.0))}
    got = pb.paired(walls, "cold")
    assert got["median"] == 1.0 and got["n"] == 5 and 0.9 <= got["ci95"][0] <= 1.0 <= got["ci95"][1] <= 1.1
    assert pb.paired(walls, "warm") is None
    shim, w = {"LD_PRELOAD": "/x/libproteus.so"}, tmp_path
    assert pb.mode_env("native", shim, w, "t", {}) == {}
    # the control: its report is counters and the timeline, written without Python
    assert pb.mode_env("disabled", shim, w, "t", {}) == {**shim, "PROTEUS_DISABLE": "1", "PROTEUS_REPORT": str(w / "t.json")}
    run = {"spawn_ns": 1_000_000, "reaped_ns": 900_000_000}
    timeline = {"shim_loaded": 3_000_000, "main_start": 13_000_000, "main_end": 813_000_000, "report": 814_500_000}
    assert pb.segments(run, {"timeline_ns": timeline}) == {"to_shim": 2.0, "static_init": 10.0, "main": 800.0,
                                                           "exit_handlers": 1.5, "teardown": 85.5}
    assert pb.segments(run, {"timeline_ns": {**timeline, "main_start": 0}}) == {}  # main not wrapped
    assert pb.segments(run, {}) == {}
    assert pb.mode_env("warm", shim, w, "t", {"warm": w / "kept"}) == {**shim, "PROTEUS_REPORT": str(w / "t.json"),
                                                                       "PROTEUS_CACHE_DIR": str(w / "kept")}
    cold = {**shim, "PROTEUS_REPORT": str(w / "t.json"), "PROTEUS_CACHE_DIR": str(w / "cache" / "t")}
    assert pb.mode_env("cold", shim, w, "t", {"warm": w / "kept"}) == cold  # the defaults, whatever they are
    assert pb.mode_env("cold, sync", shim, w, "t", {}) == {**cold, "PROTEUS_ASYNC_COMPILATION": "0"}
    assert pb.mode_env("cold, async", shim, w, "t", {}) == {**cold, "PROTEUS_ASYNC_COMPILATION": "1"}
    # the warm cache with the compiler warmed up at start, as every synchronous run does
    assert pb.mode_env("warm, compiler loaded", shim, w, "t", {"warm, compiler loaded": w / "kept"}) == \
        {**shim, "PROTEUS_REPORT": str(w / "t.json"), "PROTEUS_CACHE_DIR": str(w / "kept"), "PROTEUS_ASYNC_COMPILATION": "0"}
    def run(rep, wall, context, work, launches):
        return {"rep": rep, "wall_s": wall, "context_s": context, "work_s": work, "launch_calls_s": launches}
    runs = {"native": [run(0, 0.700, 0.2, 0.4, 0.08), run(1, 0.800, 0.2, 0.5, 0.09), run(2, 0.600, 0.2, 0.3, 0.1)],
            "cold": [run(0, 0.710, 0.2, 0.405, 0.085), run(1, 0.830, 0.21, 0.51, 0.1), run(3, 9.0, 9.0, 9.0, 9.0)]}
    diffs = pb.paired_differences(runs)
    assert list(diffs) == ["cold"]  # repetition 3 has no native run: left out
    assert diffs["cold"] == {"run": 20.0, "context": 5.0, "work": 7.5, "launch calls": 7.5, "the rest": 7.5}
    md = pb.markdown({**doc, "changing_scalars": {"step counter": {**doc["changing_scalars"]["step counter"], "runs": runs}}})
    assert "| step counter | cold | +20.0 | +5.0 | +7.5 | +7.5 | +7.5 |" in md
    # --render: the markdown again from a results file, running nothing
    saved = tmp_path / "series.json"
    saved.write_text(json.dumps({**doc, "changing_scalars": {"step counter": {**doc["changing_scalars"]["step counter"],
                                                                               "runs": runs}}}))
    assert pb.main(["--render", str(saved)]) == 0 and "| step counter | cold | +20.0 |" in saved.with_suffix(".md").read_text()
    (tmp_path / "junk.json").write_text("[1]")
    assert pb.main(["--render", str(tmp_path / "junk.json")]) == 2
    assert "junk.json: not a policy_bench result" in capsys.readouterr().err and not (tmp_path / "junk.md").exists()
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "changing_scalars").write_text('#!/bin/sh\necho verified\n[ "$SAMPLE_TIMES" = 1 ] && echo "times: context 250.5 ms, '
                                           'work 400.25 ms, launch calls 90.5 ms, host computation 300 ms, launch calls over '
                                           '0.2 ms 3 taking 4.5 ms, longest 2.25 ms" >&2\nexit 0\n')
    (fake / "changing_scalars").chmod(0o755)
    monkeypatch.setattr(pb, "SAMPLES", fake)
    r = pb.run_sample(("1",), {}, 30)
    assert r["ok"] and r["stdout"] == "verified\n" and r["phases"] == {"context_s": 0.2505, "work_s": 0.40025, "launch_calls_s": 0.0905,
                                                                    "host_compute_s": 0.3, "slow_launches": 3,
                                                                    "slow_launches_s": 0.0045, "longest_launch_s": 0.00225}
    assert set(r["usage"]) == {"user_s", "sys_s", "voluntary_switches", "involuntary_switches"}
    monkeypatch.setattr(pb, "SAMPLES", tmp_path / "missing")
    assert pb.main(["--out", str(tmp_path)]) == 2 and "build the samples" in capsys.readouterr().err
    assert pb.main(["--out", str(tmp_path), "--sample-modes", "cold;lukewarm"]) == 2
    assert "unknown mode, configuration or workload: lukewarm" in capsys.readouterr().err
    assert pb.main(["--out", str(tmp_path), "--workload-modes", "cold;tepid", "--apps", "adam;nbody"]) == 2
    assert "unknown mode, configuration or workload: tepid, nbody" in capsys.readouterr().err


def test_pool_policy_pairs_each_repetition_across_series(tmp_path, capsys):
    def series(name, native, cold, warm=None):
        modes = {"native": {"runs": native}, "cold": {"runs": cold}}
        if warm is not None:
            modes["warm"] = {"runs": warm}
        path = tmp_path / name
        path.write_text(json.dumps({"environment": {"git_commit": "abc"}, "changing_scalars": {"step counter": {"modes": modes}}}))
        return path

    a = series("a.json", [1.0, 2.0], [1.25, 2.0], [1.0, 2.5])
    b = series("b.json", [1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0])  # warm lost a repetition: left out here
    assert pp.main(["--out", str(tmp_path / "p"), "--group", "both", str(a), str(b)]) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    cells = doc["groups"]["both"]["configs"]["step counter"]
    assert cells["native/cold"]["n"] == 5 and cells["native/cold"]["median"] == 1.0  # 0.8, 1, 1, 0.5, 1
    assert [s["median"] for s in cells["native/cold"]["series"]] == [0.9, 1.0]
    assert cells["native/warm"]["n"] == 2 and [s["file"] for s in cells["native/warm"]["series"]] == ["a.json"]
    assert "| step counter | native/cold | 1.0× [" in (tmp_path / "p.md").read_text()
    capsys.readouterr()
    assert pp.main(["--out", str(tmp_path / "q"), "--group", "x", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    (tmp_path / "other.json").write_text("{}")
    assert pp.main(["--out", str(tmp_path / "q"), "--group", "x", str(tmp_path / "other.json")]) == 2
    assert "not a policy_bench results file" in capsys.readouterr().err and not (tmp_path / "q.json").exists()


def test_policy_bench_learned_mode_keeps_only_the_trackers_decisions(tmp_path):
    from proteus_rewrite.cache import Entry, StorageCache
    from proteus_rewrite.policy import POLICY_KIND, RUN_KIND, encode_learned, encode_run

    warm = StorageCache(tmp_path / "warm")
    warm.put(Entry("a" * 64, "cubin", 90, b"\x7fELF variant", {}))
    warm.put(Entry("b" * 64, POLICY_KIND, 90, encode_learned(["2"]), {}))
    warm.put(Entry("c" * 64, RUN_KIND, 0, encode_run(1), {}))
    env = pb.mode_env("cold, tracker learned", {"LD_PRELOAD": "libproteus.so"}, tmp_path, "rep-0",
                      {"warm": tmp_path / "warm", "learned": tmp_path / "warm"})
    seeded = StorageCache(env["PROTEUS_CACHE_DIR"])
    assert env["PROTEUS_CACHE_DIR"] == str(tmp_path / "cache" / "rep-0")
    assert [p.name[:64] for p, _ in seeded.entries()] == ["b" * 64]
    assert seeded.get("b" * 64).data == encode_learned(["2"])
    assert len(warm.entries()) == 3  # the warm cache itself is left whole
