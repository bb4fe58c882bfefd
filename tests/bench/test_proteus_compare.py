"""bench/proteus_compare.py against fake programs, a fake tool and a fake Proteus bundle: the
figures it reads, the ratios it reports and the output check (it runs once per GPU session)."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from bench import proteus_compare as pc
from bench import validate_paper as vp

RSBENCH = """Running on: NVIDIA H100 80GB HBM3
Kernel initialization, compilation, and execution took {t} seconds.
Total Time Statistics (CUDA Init / JIT Compilation + Simulation Kernel)
Runtime:               {t} seconds
Lookups/s:             2,663,880
Simulation Kernel Only Statistics
Lookups/s:             {rate}
Verification checksum: {check} (Valid)
"""


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\ncat <<'X'\n" + text + "X\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_figures_ratios_and_output_check(tmp_path):
    hec, up = tmp_path / "hec", tmp_path / "up"
    _exe(hec / "rsbench" / "main_plain", RSBENCH.format(t="3.2", rate="10,000,000", check=358389))
    _exe(hec / "rsbench" / "main_all", RSBENCH.format(t="2.9", rate="12,500,000", check=358389))
    _exe(up / "bin" / "rsbench.exe", RSBENCH.format(t="2.5", rate="20,000,000", check=999))  # a wrong checksum
    (up / "src" / "rsbench").mkdir(parents=True)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')  # proteus-rewrite EXE -o DIR
    tool.chmod(0o755)
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out),
                    "--programs", "rsbench", "--commit", "abc", "--alt", "PROTEUS_OCCUPANCY_STEP=0"]) == 0
    doc = json.loads((out / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert r["plain"]["metrics"]["kernel lookups/s"]["median"] == 10_000_000  # the kernel-only rate, not the total
    assert r["ours_warm"]["all_ok"] and not r["proteus_warm"]["all_ok"]  # timing masked, checksum not
    md = (out / "proteus-compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| rsbench"))
    assert "| 1.25x | 2.00x | 1.00x |" in row  # ours / plain, Proteus / plain, ours / native
    assert row.endswith("| yes | yes | NO | - |")  # native = plain, ours = native, Proteus = plain
    assert "ours warm with PROTEUS_OCCUPANCY_STEP=0: 1.25e+07 (1.25e+07-1.25e+07), 1.25x plain" in md
    assert len(r["native"]["runs"]) == 3  # the bitcode build is timed like the plain one
    assert "Host CPU, warm (user + system s of the process and its children, median): rsbench: plain " in md


def test_masking_keeps_results_and_hides_times():
    a = pc.masked("Elapsed time = 4.35 (s)\nFinal Origin Energy = 9.087649e+08\n")
    b = pc.masked("Elapsed time = 5.01 (s)\nFinal Origin Energy = 9.087649e+08\n")
    assert a == b
    assert pc.masked("Final Origin Energy = 9.087649e+08") != pc.masked("Final Origin Energy = 9.087650e+08")


def test_sw4ck_reads_the_second_average():
    text = "Average execution time of sw4ck kernels: 6.55 milliseconds\n\nError = 0 %\n\n" \
           "Average execution time of sw4ck kernels: 8.85 milliseconds\n"
    assert pc.metrics("sw4ck", text) == {"avg kernels ms": 8.85}


def test_ours_is_held_to_the_native_run_and_extra_builds(tmp_path):
    hec, up = tmp_path / "hec", tmp_path / "up"
    _exe(hec / "rsbench" / "main_plain", RSBENCH.format(t="3.2", rate="10,000,000", check=358389))
    _exe(hec / "rsbench" / "main_all", RSBENCH.format(t="2.9", rate="12,500,000", check=358390))  # bitcode build differs
    _exe(up / "bin" / "rsbench.exe", RSBENCH.format(t="2.5", rate="20,000,000", check=358389))
    (up / "src" / "rsbench").mkdir(parents=True)
    # an extra build whose output changes when every launch waits for its variant
    odd = hec / "rsbench" / "main_on"
    odd.write_text('#!/bin/sh\nif [ "$PROTEUS_ASYNC_COMPILATION" = 0 ]; then echo "checksum 2"; else echo "checksum 1"; fi\n')
    odd.chmod(0o755)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out),
                    "--programs", "rsbench", "--extra", "rsbench=main_on"]) == 0
    md = (out / "proteus-compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| rsbench"))
    assert row.endswith("| NO | yes | yes | - |")  # ours prints what main_all prints natively, not plain's
    assert "rsbench/main_on: native exit 0; under the tool, output = native: " \
           "cold with PROTEUS_ASYNC_COMPILATION=0 NO, warm yes" in md


def test_warm_runs_are_interleaved_and_a_program_may_take_more(tmp_path):
    """Cold rounds first (plain, ours and Proteus from emptied caches), then warm ones (plain,
    native, ours, Proteus): one run of each build per round, in an order rotated from round to
    round, so that a drift of the host falls on all."""
    hec, up, log = tmp_path / "hec", tmp_path / "up", tmp_path / "order.log"
    for path, name in ((hec / "rsbench" / "main_plain", "plain"), (hec / "rsbench" / "main_all", "all"),
                       (up / "bin" / "rsbench.exe", "proteus")):
        path.parent.mkdir(parents=True, exist_ok=True)
        # the rewritten copy of main_all says "ours" (its cache is set), a cold run "cold"
        path.write_text(f'#!/bin/sh\nn={name}\n[ -n "$PROTEUS_REPORT" ] && n="$n-cold"\n'
                        f'[ "$n" = all ] && [ -n "$PROTEUS_CACHE_DIR" ] && n=ours\necho "$n" >> {log}\n'
                        + "cat <<'X'\n" + RSBENCH.format(t="1", rate="10", check=1) + "X\n")
        path.chmod(0o755)
    (up / "src" / "rsbench").mkdir(parents=True)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    args = ["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--programs", "rsbench"]
    assert pc.main([*args, "--out", str(tmp_path / "out"), "--reps", "3,rsbench=4"]) == 0
    order = log.read_text().split()
    cold, warm = order[:12], order[12:]
    assert cold == ["plain", "all-cold", "proteus", "all-cold", "proteus", "plain",
                    "proteus", "plain", "all-cold", "plain", "all-cold", "proteus"]
    assert warm == ["plain", "all", "ours", "proteus", "all", "ours", "proteus", "plain",
                    "ours", "proteus", "plain", "all", "proteus", "plain", "all", "ours"]
    doc = json.loads((tmp_path / "out" / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert doc["stamp"]["reps_for"] == {"rsbench": 4} and len(r["ours_warm"]["runs"]) == len(r["plain_cold"]["runs"]) == 4
    try:
        pc.main([*args, "--out", str(tmp_path / "out2"), "--reps", "3,rsbench=2"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("two runs of a series were accepted")


def test_padding_of_timing_figures_is_not_a_difference():
    # lulesh aligns its figures: a native run and a tool run differ only in a number's width
    assert pc.masked("FOM                  =  38713.256 (z/s)") == pc.masked("FOM                  =   4575.23 (z/s)")
    assert (pc.masked("Grind time (us/z/c)  = 0.0218 (per dom)  (0.0218 overall)")
            == pc.masked("Grind time (us/z/c)  = 0.02 (per dom)  ( 0.02 overall)"))
    assert pc.masked("MaxAbsDiff   = 0.000000e+00") != pc.masked("MaxAbsDiff   = 1.000000e-07")


def test_render_joins_calls_and_judges_again(tmp_path):
    hec, up = tmp_path / "hec", tmp_path / "up"
    for prog in ("rsbench", "wsm5"):
        _exe(up / "bin" / f"{prog}.exe", RSBENCH.format(t="2.5", rate="20,000,000", check=1))
        (up / "src" / prog).mkdir(parents=True)
    _exe(hec / "rsbench" / "main_plain", RSBENCH.format(t="3.2", rate="10,000,000", check=1))
    _exe(hec / "rsbench" / "main_all", RSBENCH.format(t="3.2", rate="10,000,000", check=1))
    _exe(hec / "wsm5" / "main_plain", "Checksum: rain = 2.759982\nAverage kernel execution time: 263.2 (ms)\n")
    _exe(hec / "wsm5" / "main_all", "Checksum: rain = 2.759990\nAverage kernel execution time: 150.0 (ms)\n")
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    for prog in ("rsbench", "wsm5"):
        assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(tmp_path / prog),
                        "--programs", prog, "--commit", prog]) == 0
    assert pc.main(["--render", str(tmp_path / "all"), str(tmp_path / "rsbench" / "proteus-compare.json"),
                    str(tmp_path / "wsm5" / "proteus-compare.json")]) == 0
    md = (tmp_path / "all" / "proteus-compare.md").read_text()
    assert ": commit rsbench, " in md and ": commit wsm5, " in md
    # rendered again with a newer call of one program: its stamp replaces the older one's
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(tmp_path / "again"),
                    "--programs", "wsm5", "--commit", "again"]) == 0
    assert pc.main(["--render", str(tmp_path / "joined"), str(tmp_path / "all" / "proteus-compare.json"),
                    str(tmp_path / "again" / "proteus-compare.json")]) == 0
    calls = [l for l in (tmp_path / "joined" / "proteus-compare.md").read_text().splitlines() if l.startswith("- ")]
    assert len(calls) == 2 and calls[0].endswith(": rsbench") and "commit again" in calls[1] and calls[1].endswith(": wsm5")
    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| rsbench") or line.startswith("| wsm5")}
    assert rows["| rsbench"].endswith("| yes | yes | yes | - |")
    assert rows["| wsm5"].endswith("| NO | yes | NO | - |")  # the bitcode build prints its own checksum, ours the same


def test_validate_paper_reads_the_checks_and_compares_the_output(tmp_path):
    hec = tmp_path / "hec"
    text = RSBENCH.format(t="2.9", rate="12,500,000", check=358389)
    (hec / "rsbench").mkdir(parents=True)
    app = hec / "rsbench" / "main_all"
    app.write_text("#!/bin/sh\ncat <<'X'\n" + text + "X\n"
                   'if [ -n "$PROTEUS_VALIDATE" ]; then echo \'{"kernels": [{"launches": 1, "specialized_launches": 1}], '
                   '"validation": [{"kernel": "lookup", "verdict": "same", "ms": 12.5}]}\' > "$PROTEUS_REPORT"; fi\n')
    app.chmod(0o755)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    assert vp.main(["--hec", str(hec), "--tool", str(tool), "--out", str(tmp_path / "o"), "--programs", "rsbench",
                    "--commit", "abc"]) == 0
    r = json.loads((tmp_path / "o" / "validate-paper.json").read_text())["programs"]["rsbench"]
    assert r["same_output"] and r["checks"] == {"same": 1, "within-ulps": 0, "differs": 0, "varies": 0, "skipped": 0}
    assert r["check_ms"] == 12.5 and r["specialized_launches"] == 1
    row = next(l for l in (tmp_path / "o" / "validate-paper.md").read_text().splitlines() if l.startswith("| rsbench"))
    assert row.startswith("| rsbench | yes | 1 | 0 | 0 | 1/1 | 12.5 |")


def test_speed_trials_come_from_the_cold_runs_report(tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"kernels": [
        {"name": "_Z2k1v", "demangled": "k1()", "kernel_time_vs_original": 1.2,
         "variants": [{"speed": {"verdict": "slower"}}, {"speed": {"verdict": "kept"}}, {}]},
        {"name": "_Z2k2v", "variants": [{}]}]}))
    assert pc.speed_trials(report) == [{"kernel": "k1()", "verdicts": {"kept": 1, "slower": 1, "undecided": 0},
                                        "time_vs_original": 1.2}]
    assert pc.speed_trials(tmp_path / "missing.json") == []


def _traced_exe(path: Path, text: str, kernels: list[tuple[str, int]]) -> None:
    """A fake program that also writes what the CUPTI library would (kernel_trace.c)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    timed = "".join(f"{n}\\t{ns}\\n" for n, ns in kernels)
    names = "".join(f"{n}\\n" for n, _ in kernels)
    path.write_text("#!/bin/sh\ncat <<'X'\n" + text + "X\n"
                    'if [ -n "$CUPTI_KERNEL_TRACE_FILE" ]; then\n'
                    f'  if [ "$CUPTI_KERNEL_TRACE_TIMES" = 1 ]; then printf \'{timed}\' > "$CUPTI_KERNEL_TRACE_FILE";\n'
                    f'  else printf \'{names}\' > "$CUPTI_KERNEL_TRACE_FILE"; fi\nfi\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_gpu_time_rounds_sum_each_runs_kernels_by_kernel(tmp_path):
    hec, up = tmp_path / "hec", tmp_path / "up"
    text = RSBENCH.format(t="3.2", rate="10,000,000", check=358389)
    _traced_exe(hec / "rsbench" / "main_plain", text, [("_Z1kv", 2_000_000), ("_Z1kv", 2_000_000), ("_Z1gv", 1_000_000)])
    # the rewritten copy runs as ours: its variant carries the mark
    _traced_exe(hec / "rsbench" / "main_all", text, [("_Z1kv$proteus$ab", 1_000_000), ("_Z1kv$proteus$ab", 1_000_000),
                                                      ("_Z1gv", 1_000_000)])
    _traced_exe(up / "bin" / "rsbench.exe", text, [("_Z1kv$jit", 1_500_000), ("_Z1kv$jit", 1_500_000), ("_Z1gv", 1_000_000)])
    (up / "src" / "rsbench").mkdir(parents=True)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    lib = tmp_path / "libkernel_trace.so"
    lib.write_bytes(b"")  # the fakes write the trace themselves
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out), "--programs", "rsbench",
                    "--kernel-trace-lib", str(lib), "--gpu-time-rounds", "3"]) == 0
    r = json.loads((out / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert {k: v["median"] for k, v in r["gpu_ms"].items()} == {"plain": 5.0, "native": 3.0, "ours_warm": 3.0, "proteus_warm": 4.0}
    assert r["gpu_ms"]["plain"]["n"] == 3
    assert r["gpu_kernel_ms"]["ours_warm"] == {"_Z1kv": 2.0, "_Z1gv": 1.0} and r["gpu_kernel_ms"]["proteus_warm"]["_Z1kv"] == 3.0
    md = (out / "proteus-compare.md").read_text()
    assert "plain 5.00 (5.00-5.00); native 3.00 (3.00-3.00), 1.667x; ours 3.00 (3.00-3.00), 1.667x; Proteus 4.00 (4.00-4.00), 1.250x" in md
    assert "_Z1kv 4.00 / 2.00 / 3.00" in md
    with pytest.raises(SystemExit) as refused:
        pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out), "--gpu-time-rounds", "2"])
    assert refused.value.code == 2


def test_cold_rounds_may_be_more_and_are_paired_by_round(tmp_path):
    """--cold-reps: more cold rounds than warm ones (lulesh's host moves its end to end by 10-25%
    between runs), and each round's plain run over the JIT's beside it, summarized."""
    hec, up = tmp_path / "hec", tmp_path / "up"
    for path in (hec / "rsbench" / "main_plain", hec / "rsbench" / "main_all", up / "bin" / "rsbench.exe"):
        _exe(path, RSBENCH.format(t="1", rate="10", check=1))
    (up / "src" / "rsbench").mkdir(parents=True)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--programs", "rsbench",
                    "--out", str(out), "--reps", "3", "--cold-reps", "3,rsbench=5"]) == 0
    doc = json.loads((out / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert [len(r[k]["runs"]) for k in ("plain_cold", "ours_cold", "proteus_cold", "plain", "ours_warm")] == [5, 5, 5, 3, 3]
    assert doc["stamp"]["cold_reps_for"] == {"rsbench": 5}
    md = (out / "proteus-compare.md").read_text()
    assert "(rsbench 5 cold)" in md and "rsbench, cold end to end paired by round" in md and "5 rounds" in md

    def runs(*walls):
        return {"runs": [{"rc": 0, "wall_s": w} for w in walls]}
    res = {"plain_cold": runs(4.0, 3.0, 3.6), "ours_cold": runs(4.0, 3.3, 3.0)}
    # per round 1.0, 0.909, 1.2: the median pairs a slow plain run with its own round's
    assert pc.paired(res, "plain_cold", "ours_cold") == {"median": 1.0, "min": 3.0 / 3.3, "max": 1.2, "n": 3}
    res["ours_cold"]["runs"][1]["rc"] = 1  # a failed run: no pairs to speak of
    assert pc.paired(res, "plain_cold", "ours_cold") is None
    assert pc.paired({"plain_cold": runs(1.0, 2.0), "ours_cold": runs(1.0)}, "plain_cold", "ours_cold") is None
    with pytest.raises(SystemExit) as exc:
        pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out), "--cold-reps", "2"])
    assert exc.value.code == 2


def test_a_program_split_into_cold_and_warm_calls_is_joined(tmp_path):
    """--phase: sw4ck's rounds outlast a device call, so its cold rounds run in one call and its
    warm ones in the next, each beside plain runs of its own; the warm call fills a cache that
    did not survive, and --render joins the two into one row."""
    hec, up, cache = tmp_path / "hec", tmp_path / "up", tmp_path / "cache"
    for path, rate in ((hec / "rsbench" / "main_plain", "10"), (hec / "rsbench" / "main_all", "15"),
                       (up / "bin" / "rsbench.exe", "12")):
        path.parent.mkdir(parents=True, exist_ok=True)
        # a JIT run leaves an entry in its cache, as both JITs do
        path.write_text('#!/bin/sh\n[ -n "$PROTEUS_CACHE_DIR" ] && mkdir -p "$PROTEUS_CACHE_DIR" '
                        '&& echo "$0" >> "$PROTEUS_CACHE_DIR/entry"\n'
                        "cat <<'X'\n" + RSBENCH.format(t="1", rate=rate, check=1) + "X\n")
        path.chmod(0o755)
    (up / "src" / "rsbench").mkdir(parents=True)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')
    tool.chmod(0o755)
    args = ["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--programs", "rsbench", "--cache-dir", str(cache)]
    assert pc.main([*args, "--out", str(tmp_path / "c"), "--phase", "cold", "--commit", "one"]) == 0
    c = json.loads((tmp_path / "c" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert set(c) >= {"plain_cold", "ours_cold", "proteus_cold", "native"} and "ours_warm" not in c
    assert len(c["native"]["runs"]) == 1 and c["ours_cold"]["all_ok"]  # ours judged against a native run of its own call
    assert "cold rounds only" in (tmp_path / "c" / "proteus-compare.md").read_text()
    assert pc.main([*args, "--out", str(tmp_path / "w"), "--phase", "warm", "--commit", "two"]) == 0
    w = json.loads((tmp_path / "w" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert "ours_fill" not in w and "plain_cold" not in w and len(w["native"]["runs"]) == 3  # the cold call's caches served
    row = next(l for l in (tmp_path / "w" / "proteus-compare.md").read_text().splitlines() if l.startswith("| rsbench"))
    assert row.endswith("| yes | yes | yes | - |")  # outputs judged on the series this call ran
    shutil.rmtree(cache)
    assert pc.main([*args, "--out", str(tmp_path / "w2"), "--phase", "warm"]) == 0
    w2 = json.loads((tmp_path / "w2" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert w2["ours_fill"]["rc"] == 0 and w2["proteus_fill"]["rc"] == 0 and (cache / "ours" / "rsbench" / "entry").exists()
    assert pc.main(["--render", str(tmp_path / "j"), str(tmp_path / "c" / "proteus-compare.json"),
                    str(tmp_path / "w" / "proteus-compare.json")]) == 0
    doc = json.loads((tmp_path / "j" / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert r["phase"] == "cold+warm" and len(r["native"]["runs"]) == 3 and len(r["plain_cold"]["runs"]) == 3
    md = (tmp_path / "j" / "proteus-compare.md").read_text()
    calls = [l for l in md.splitlines() if l.startswith("- ")]
    assert len(calls) == 2 and "commit one" in calls[0] and calls[0].endswith("rsbench (cold rounds only)")
    assert calls[1].endswith("rsbench (warm rounds only)")
    row = next(l for l in md.splitlines() if l.startswith("| rsbench"))
    # the cold rounds of a later call replace those of a whole program's, and keep its warm ones
    assert pc.main([*args, "--out", str(tmp_path / "b")]) == 0
    both = json.loads((tmp_path / "b" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert pc.main(["--render", str(tmp_path / "j2"), str(tmp_path / "b" / "proteus-compare.json"),
                    str(tmp_path / "c" / "proteus-compare.json")]) == 0
    j2 = json.loads((tmp_path / "j2" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert j2["native"] == both["native"] and j2["ours_warm"] == both["ours_warm"] and j2["plain_cold"] == r["plain_cold"]
    calls = [l for l in (tmp_path / "j2" / "proteus-compare.md").read_text().splitlines() if l.startswith("- ")]
    assert calls[0].endswith(": rsbench (warm rounds)") and calls[1].endswith("rsbench (cold rounds only)")
    # and the warm rounds of a later call too: nothing of the first is left, nor of a cold call replaced
    assert pc.main(["--render", str(tmp_path / "j3"), str(tmp_path / "b" / "proteus-compare.json"),
                    str(tmp_path / "c" / "proteus-compare.json"), str(tmp_path / "w" / "proteus-compare.json"),
                    str(tmp_path / "c" / "proteus-compare.json")]) == 0
    calls = [l for l in (tmp_path / "j3" / "proteus-compare.md").read_text().splitlines() if l.startswith("- ")]
    assert len(calls) == 2 and calls[0].endswith("rsbench (warm rounds only)") and calls[1].endswith("rsbench (cold rounds only)")
    cells = row.split(" | ")
    assert cells[6:9] == ["1.50x", "1.20x", "1.00x"] and "x)" in cells[9] and "x)" in cells[10]  # warm ratios, cold e2e
    assert row.endswith("| yes | yes | yes | - |")


def test_a_run_counts_the_host_cpu_of_the_process_and_its_children(tmp_path):
    spin = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    busy = pc.run(["sh", "-c", f"({spin}) & {spin}; wait"], tmp_path, {}, 60)  # two processes busy at once
    idle = pc.run(["sh", "-c", "sleep 0.3"], tmp_path, {}, 60)
    assert busy["cpu_s"] > 0.75 * busy["wall_s"] and busy["cpu_s"] > 0.1
    assert idle["cpu_s"] < 0.1 < idle["wall_s"]


def _nvcc_build(path: Path, differs: bool) -> None:
    """A fake nvcc build: natively 11 M lookups/s; rewritten and run under the tool (its cache
    set) 13.2 M, with variants in its CUPTI trace and, when `differs`, another checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    native = RSBENCH.format(t="3.0", rate="11,000,000", check=7)
    ours = RSBENCH.format(t="2.8", rate="13,200,000", check=8 if differs else 7)
    path.write_text('#!/bin/sh\nif [ -n "$PROTEUS_CACHE_DIR" ]; then\n'
                    "cat <<'X'\n" + ours + "X\n"
                    '  [ -n "$CUPTI_KERNEL_TRACE_FILE" ] && printf \'_Z6lookupv$proteus$ab\\n_Z6lookupv$proteus$ab\\n_Z4initv\\n\' '
                    '> "$CUPTI_KERNEL_TRACE_FILE"\n  true\nelse\n'
                    "cat <<'X'\n" + native + "X\nfi\n")
    path.chmod(0o755)


def _nvcc_setup(tmp_path: Path, differs: bool) -> tuple[Path, Path, Path]:
    hec, up = tmp_path / "hec", tmp_path / "up"
    _exe(hec / "rsbench" / "main_plain", RSBENCH.format(t="3.2", rate="10,000,000", check=7))
    _exe(hec / "rsbench" / "main_all", RSBENCH.format(t="2.9", rate="12,500,000", check=7))
    _exe(up / "bin" / "rsbench.exe", RSBENCH.format(t="2.5", rate="20,000,000", check=7))
    (up / "src" / "rsbench").mkdir(parents=True)
    _nvcc_build(hec / "rsbench" / "main_nvcc", differs)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/"\n')  # proteus-rewrite EXE -o DIR
    tool.chmod(0o755)
    return hec, up, tool


def test_nvcc_builds_natively_and_under_the_tool(tmp_path):
    """--nvcc: the nvcc build natively (nvcc AOT) and rewritten (ours on nvcc), cold and warm in
    the same rounds; the ratios over nvcc AOT and over Proteus warm; a CUPTI-traced warm run."""
    hec, up, tool = _nvcc_setup(tmp_path, differs=False)
    lib = tmp_path / "libkernel_trace.so"
    lib.write_bytes(b"")  # the fakes write the trace themselves
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out),
                    "--programs", "rsbench", "--nvcc", "--kernel-trace-lib", str(lib)]) == 0
    doc = json.loads((out / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert doc["stamp"]["nvcc"] is True
    assert [len(r[k]["runs"]) for k in ("nvcc", "nvcc_cold", "ours_nvcc_cold", "ours_nvcc_warm", "ours_nvcc_traced")] == [3, 3, 3, 3, 1]
    assert r["nvcc"]["metrics"]["kernel lookups/s"]["median"] == 11_000_000
    assert r["ours_nvcc_warm"]["metrics"]["kernel lookups/s"]["median"] == 13_200_000
    assert r["ours_nvcc_warm"]["all_ok"] and r["ours_nvcc_cold"]["all_ok"] and r["nvcc"]["all_ok"]
    assert r["cupti_nvcc"]["variant_launches"] == 2 and r["cupti_nvcc"]["launches"] == 3
    ratios = r["nvcc_ratios"]["kernel lookups/s"]
    assert ratios["ours_nvcc_vs_nvcc"]["ratio"] == pytest.approx(1.2)
    assert ratios["ours_nvcc_vs_nvcc"]["by_round"]["n"] == 3
    assert ratios["ours_nvcc_vs_proteus"]["ratio"] == pytest.approx(0.66)
    assert r["nvcc_ratios"]["cold_e2e_by_round"]["n"] == 3
    # ours on the bitcode build keeps its own cache and trace
    assert (out / "cache" / "ours-nvcc" / "rsbench") != (out / "cache" / "ours" / "rsbench")
    assert (out / "rsbench.nvcc.kernels.txt").exists() and r["ours_traced"]["runs"] and r["cupti"]["launches"] == 0
    md = (out / "proteus-compare.md").read_text()
    main_row = next(line for line in md.splitlines() if line.startswith("| rsbench | kernel"))
    assert main_row.endswith("| yes | yes | yes | 0/0 |")  # the main table as without --nvcc
    assert "**nvcc builds**" in md
    row = [line for line in md.splitlines() if line.startswith("| rsbench | kernel")][1]
    cells = row.split(" | ")
    assert cells[3] == "1.1e+07 (1.1e+07-1.1e+07)" and cells[4] == "1.32e+07 (1.32e+07-1.32e+07)"
    assert cells[7] == "1.20x (1.20-1.20)" and cells[8] == "0.66x (0.66-0.66)"  # over nvcc AOT, over Proteus warm
    assert "x)" in cells[9]  # cold end to end, nvcc AOT / ours on nvcc
    assert row.endswith("| yes | yes | 2/3 |")  # nvcc = plain, ours-nvcc = nvcc, variant launches of 3
    assert "ours on nvcc over nvcc AOT" in md and ", nvcc AOT " in md


def test_nvcc_output_difference_is_flagged(tmp_path):
    hec, up, tool = _nvcc_setup(tmp_path, differs=True)
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out),
                    "--programs", "rsbench", "--nvcc"]) == 0
    r = json.loads((out / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert not r["ours_nvcc_warm"]["all_ok"] and not r["ours_nvcc_cold"]["all_ok"]  # checksum 8, natively 7
    assert r["ours_warm"]["all_ok"]  # ours on the bitcode build is judged against its own native run
    rows = [line for line in (out / "proteus-compare.md").read_text().splitlines() if line.startswith("| rsbench | kernel")]
    assert rows[0].endswith("| yes | yes | yes | - |") and rows[1].endswith("| NO | - |")  # ours-nvcc = nvcc: NO


def test_nvcc_missing_build_and_phases(tmp_path):
    """A program without main_nvcc says so in the nvcc table; --phase cold and warm with --nvcc
    join into one row, ours on nvcc judged against the nvcc runs of its call."""
    hec, up, tool = _nvcc_setup(tmp_path, differs=False)
    args = ["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--programs", "rsbench", "--nvcc",
            "--cache-dir", str(tmp_path / "cache")]
    assert pc.main([*args, "--out", str(tmp_path / "c"), "--phase", "cold"]) == 0
    c = json.loads((tmp_path / "c" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert c["ours_nvcc_cold"]["all_ok"] and "nvcc" not in c and "ours_nvcc_warm" not in c
    assert pc.main([*args, "--out", str(tmp_path / "w"), "--phase", "warm"]) == 0
    w = json.loads((tmp_path / "w" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    # the fakes leave their caches empty: the warm call fills each (the nvcc cold run beside it is no JIT)
    assert w["ours_nvcc_fill"]["rc"] == 0 and "nvcc_fill" not in w and w["ours_nvcc_warm"]["all_ok"]
    assert pc.main(["--render", str(tmp_path / "j"), str(tmp_path / "c" / "proteus-compare.json"),
                    str(tmp_path / "w" / "proteus-compare.json")]) == 0
    j = json.loads((tmp_path / "j" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert {"nvcc", "nvcc_cold", "ours_nvcc_cold", "ours_nvcc_warm"} <= set(j) and j["nvcc_ratios"]["cold_e2e_by_round"]["n"] == 3
    (hec / "rsbench" / "main_nvcc").unlink()
    assert pc.main([*args, "--out", str(tmp_path / "m")]) == 0
    m = json.loads((tmp_path / "m" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert "no such file" in m["nvcc_error"] and m["ours_warm"]["all_ok"]  # the other builds ran as ever
    assert any(line.startswith("| rsbench | ") and "main_nvcc: no such file" in line
               for line in (tmp_path / "m" / "proteus-compare.md").read_text().splitlines())


def _ptx_setup(tmp_path: Path, differs: bool = False) -> tuple[Path, Path, Path, Path]:
    """main_all whose rewritten copy says which route the fake tool recorded it for: the tool
    keeps its environment beside the copy and marks the copy's route (PROTEUS_CODE_KIND); under
    the tool (its cache set) the copy runs at 12.5 M lookups/s on the bitcode route, 15 M on the
    PTX route (another checksum, when `differs`), each with its own CUPTI trace. Every run logs
    what ran to order.log."""
    hec, up, log = tmp_path / "hec", tmp_path / "up", tmp_path / "order.log"
    for path, name, rate in ((hec / "rsbench" / "main_plain", "plain", "10,000,000"),  # natively main_all prints 7
                             (up / "bin" / "rsbench.exe", "proteus", "20,000,000")):
        _exe(path, RSBENCH.format(t="3.2", rate=rate, check=6))
        path.write_text(path.read_text().replace("\n", f"\necho {name} >> {log}\n", 1))
    (up / "src" / "rsbench").mkdir(parents=True)
    app = hec / "rsbench" / "main_all"
    app.write_text(
        "#!/bin/sh\nn=all; rate=12,500,000; check=7; trace='_Z6lookupv$proteus$ab\\n_Z4initv\\n_Z4initv\\n'\n"
        'if [ -n "$PROTEUS_CACHE_DIR" ]; then\n  n=ours\n'
        '  if [ "$(cat kind 2>/dev/null)" = ptx ]; then\n'
        f"    n=ours-ptx; rate=15,000,000; check={8 if differs else 7}; "
        "trace='_Z6lookupv$proteus$cd\\n_Z6lookupv$proteus$cd\\n_Z4initv\\n'\n  fi\nfi\n"
        'if [ -n "$CUPTI_KERNEL_TRACE_FILE" ]; then printf "$trace" > "$CUPTI_KERNEL_TRACE_FILE"; n="$n-traced"\n'
        'elif [ -n "$PROTEUS_REPORT" ]; then n="$n-cold"; fi\n'
        f'echo "$n" >> {log}\n'
        "cat <<X\n" + RSBENCH.format(t="2.9", rate="$rate", check="$check") + "X\n")
    app.chmod(0o755)
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$1" "$3/" && env > "$3/tool.env" '
                    '&& echo "${PROTEUS_CODE_KIND:-}" > "$3/kind"\n')  # proteus-rewrite EXE -o DIR
    tool.chmod(0o755)
    return hec, up, tool, log


def test_ptx_route_beside_the_bitcode_route_on_one_binary(tmp_path):
    """--ptx-route: main_all rewritten again with PROTEUS_CODE_KIND=ptx, run cold and warm in the
    same rounds as ours, held to main_all's native output, against ours and Proteus warm, cold
    end to end paired with ours', a CUPTI-traced warm run and a table of its own."""
    hec, up, tool, log = _ptx_setup(tmp_path)
    lib = tmp_path / "libkernel_trace.so"
    lib.write_bytes(b"")  # the fakes write the trace themselves
    out = tmp_path / "out"
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(out),
                    "--programs", "rsbench", "--ptx-route", "--kernel-trace-lib", str(lib)]) == 0
    # the PTX side's rewrite alone ran with PROTEUS_CODE_KIND=ptx
    ptx_env = (out / "rewritten" / "rsbench-ptx" / "tool.env").read_text().splitlines()
    assert "PROTEUS_CODE_KIND=ptx" in ptx_env
    assert not any(v.startswith("PROTEUS_CODE_KIND=") for v in (out / "rewritten" / "rsbench" / "tool.env").read_text().splitlines())
    # cold rounds (plain, ours, Proteus, ours via PTX), then warm ones, rotated; then the traced runs
    order = log.read_text().split()
    assert order[:12] == ["plain", "ours-cold", "proteus", "ours-ptx-cold", "ours-cold", "proteus", "ours-ptx-cold", "plain",
                          "proteus", "ours-ptx-cold", "plain", "ours-cold"]
    assert order[12:27] == ["plain", "all", "ours", "proteus", "ours-ptx", "all", "ours", "proteus", "ours-ptx", "plain",
                            "ours", "proteus", "ours-ptx", "plain", "all"]
    assert order[27:] == ["ours-traced", "ours-ptx-traced"]
    assert all((out / "logs" / f"rsbench.{label}.{i}.txt").exists() for label in ("ours-ptx-cold", "ours-ptx-warm") for i in range(3))
    doc = json.loads((out / "proteus-compare.json").read_text())
    r = doc["programs"]["rsbench"]
    assert doc["stamp"]["ptx_route"] is True and r["rewrite_ptx_rc"] == 0
    assert [len(r[k]["runs"]) for k in ("ours_ptx_cold", "ours_ptx_warm", "ours_ptx_traced")] == [3, 3, 1]
    assert r["ours_ptx_warm"]["metrics"]["kernel lookups/s"]["median"] == 15_000_000
    assert r["ours_warm"]["metrics"]["kernel lookups/s"]["median"] == 12_500_000  # the bitcode route kept its own copy
    # judged against main_all's native run (checksum 7), not the plain build's (6)
    assert r["ours_ptx_cold"]["all_ok"] and r["ours_ptx_warm"]["all_ok"] and r["ours_ptx_traced"]["all_ok"]
    assert not r["native"]["all_ok"]
    assert r["cupti_ptx"]["variant_launches"] == 2 and r["cupti_ptx"]["launches"] == 3 and r["cupti"]["variant_launches"] == 1
    assert r["speed_trials_ptx"] == []  # the fakes write no report
    ratios = r["ptx_ratios"]["kernel lookups/s"]
    assert ratios["ours_ptx_vs_ours"]["ratio"] == pytest.approx(1.2) and ratios["ours_ptx_vs_ours"]["by_round"]["n"] == 3
    assert ratios["ours_ptx_vs_proteus"]["ratio"] == pytest.approx(0.75)
    assert r["ptx_ratios"]["cold_e2e_by_round"]["n"] == 3
    assert (out / "cache" / "ours-ptx" / "rsbench") != (out / "cache" / "ours" / "rsbench")
    md = (out / "proteus-compare.md").read_text()
    assert "**The PTX route on the clang build, beside the bitcode route**" in md and "**nvcc builds**" not in md
    rows = [line for line in md.splitlines() if line.startswith("| rsbench | kernel")]
    assert len(rows) == 2 and rows[0].endswith("| NO | yes | yes | 1/3 |")  # the main table as without --ptx-route
    cells = rows[1].split(" | ")
    assert cells[3] == "1.25e+07 (1.25e+07-1.25e+07)" and cells[4] == "1.5e+07 (1.5e+07-1.5e+07)"
    assert cells[7] == "1.20x (1.20-1.20)" and cells[8] == "0.75x (0.75-0.75)"  # over ours, over Proteus warm
    assert "x)" in cells[9]  # cold end to end, ours / ours via PTX
    assert rows[1].endswith("| yes | 2/3 |")
    assert "ours via PTX over ours (bitcode)" in md  # the cold end to end line, paired by round
    assert ", ours via PTX " in md  # the warm end to end line
    # rendered again from the JSON: the same table
    assert pc.main(["--render", str(tmp_path / "j"), str(out / "proteus-compare.json")]) == 0
    assert rows[1] in (tmp_path / "j" / "proteus-compare.md").read_text().splitlines()
    # without the option: no PTX side at all, and that JSON renders too
    assert pc.main(["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--out", str(tmp_path / "plain"),
                    "--programs", "rsbench"]) == 0
    assert not (tmp_path / "plain" / "rewritten" / "rsbench-ptx").exists()
    assert pc.main(["--render", str(tmp_path / "j0"), str(tmp_path / "plain" / "proteus-compare.json")]) == 0
    j0 = json.loads((tmp_path / "j0" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert "ptx_ratios" not in j0 and "PTX" not in (tmp_path / "j0" / "proteus-compare.md").read_text()


def test_ptx_route_output_difference_failed_rewrite_and_phases(tmp_path):
    hec, up, tool, _ = _ptx_setup(tmp_path, differs=True)
    args = ["--hec", str(hec), "--proteus", str(up), "--tool", str(tool), "--programs", "rsbench", "--ptx-route",
            "--cache-dir", str(tmp_path / "cache")]
    assert pc.main([*args, "--out", str(tmp_path / "c"), "--phase", "cold"]) == 0
    c = json.loads((tmp_path / "c" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert not c["ours_ptx_cold"]["all_ok"] and c["ours_cold"]["all_ok"]  # checksum 8, main_all natively 7
    assert "ours_ptx_warm" not in c and c["ptx_ratios"]["cold_e2e_by_round"]["n"] == 3
    assert pc.main([*args, "--out", str(tmp_path / "w"), "--phase", "warm"]) == 0
    w = json.loads((tmp_path / "w" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert w["ours_ptx_fill"]["rc"] == 0 and not w["ours_ptx_warm"]["all_ok"]  # the fakes leave their caches empty
    assert pc.main(["--render", str(tmp_path / "j"), str(tmp_path / "c" / "proteus-compare.json"),
                    str(tmp_path / "w" / "proteus-compare.json")]) == 0
    j = json.loads((tmp_path / "j" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert {"ours_ptx_cold", "ours_ptx_warm"} <= set(j) and j["ptx_ratios"]["kernel lookups/s"]["ours_ptx_vs_ours"]["by_round"]
    row = [line for line in (tmp_path / "j" / "proteus-compare.md").read_text().splitlines()
           if line.startswith("| rsbench | kernel")][1]
    assert row.endswith("| NO | - |")
    # a rewrite that fails: said in the table, the other builds run as ever
    bad = tmp_path / "bad-tool"
    bad.write_text(f'#!/bin/sh\n[ "$PROTEUS_CODE_KIND" = ptx ] && {{ echo "no PTX here" >&2; exit 3; }}\nexec {tool} "$@"\n')
    bad.chmod(0o755)
    args[5] = str(bad)
    assert pc.main([*args, "--out", str(tmp_path / "m")]) == 0
    m = json.loads((tmp_path / "m" / "proteus-compare.json").read_text())["programs"]["rsbench"]
    assert m["rewrite_ptx_rc"] == 3 and "no PTX here" in m["ptx_error"] and m["ours_warm"]["all_ok"] and "ptx_ratios" not in m
    assert "| rsbench | proteus-rewrite: no PTX here |" in (tmp_path / "m" / "proteus-compare.md").read_text()
