"""bench/corpora/upstream_tests: upstream's RUN lines under the tool (checks.py: lit's substitutions,
verdicts, known differences, their table), run.py end to end on RUN lines with fake programs,
and --recheck with LLVM's FileCheck (skipped without it). No GPU, no clang."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from .upstream_support import checks, chk, executable, run, upstream

# --- upstream's RUN lines under the tool (checks.py) ---------------------------------------------

FILECHECK = os.environ.get("FILECHECK", "/usr/lib/llvm-19/bin/FileCheck")


def line(env: dict, prefixes=("CHECK",), fresh=True, stderr_too=False) -> dict:
    return {"exe": "prog", "env": env, "check_prefixes": list(prefixes), "stderr_too": stderr_too,
            "fresh_cache": fresh, "line": " ".join(f"{k}={v}" for k, v in env.items()) + " %build/prog.%ext"}


@pytest.fixture(scope="module")
def doc() -> dict:
    return upstream.load_programs()


def test_run_line_env_substitutes_like_lit(tmp_path):
    cache, s_dir = tmp_path / "upstream.proteus", tmp_path / "src" / "tests" / "gpu"
    env = checks.line_env(line({"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TUNED_KERNELS": "%S/tuned_config.json",
                                "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}), cache, s_dir)
    assert env == {"PROTEUS_CACHE_DIR": str(cache), "PROTEUS_TUNED_KERNELS": f"{s_dir}/tuned_config.json",
                   "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats", "PROTEUS_ASYNC_COMPILATION": "0"}
    # upstream's default is synchronous compilation: added unless the line says otherwise
    assert checks.line_env(line({"PROTEUS_ASYNC_COMPILATION": "1"}), cache, s_dir)["PROTEUS_ASYNC_COMPILATION"] == "1"
    # and its default cache is the test's own ./.proteus: a line without one gets the program's
    assert checks.line_env(line({}), cache, s_dir)["PROTEUS_CACHE_DIR"] == str(tmp_path / "default.proteus")
    with pytest.raises(ValueError, match="%T"):
        checks.line_env(line({"PROTEUS_CACHE_DIR": "%T/x"}), cache, s_dir)
    assert checks.source_dir({"source": "tests/gpu/sub/a.cpp"}, tmp_path / "src") == tmp_path / "src/tests/gpu/sub"
    assert checks.missing_files(env, s_dir) == [f"{s_dir}/tuned_config.json"]
    s_dir.mkdir(parents=True)
    (s_dir / "tuned_config.json").write_text("{}")
    assert checks.missing_files(env, s_dir) == []


def test_a_fresh_line_empties_the_cache_a_later_one_keeps_it(tmp_path):
    cache = tmp_path / "upstream.proteus"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "entry").write_text("x")
    checks.prepare_cache(line({}, fresh=False), cache)
    assert (cache / "sub" / "entry").exists()
    checks.prepare_cache(line({}, fresh=True), cache)
    assert not cache.exists()
    checks.prepare_cache(line({}, fresh=True), cache)  # nothing there: fine


def test_run_line_reads_stderr_only_where_upstream_pipes_it():
    assert checks.line_text("out\n", "err\n", line({}, stderr_too=True)) == "out\nerr\n"
    assert checks.line_text("out\n", "err\n", line({})) == "out\n"


PROGRAM = {"name": "p", "source": "tests/gpu/p.cpp", "expected_output_source": "tests/gpu/p.cpp",
           "checks": [chk("Kernel 42", line=10),
                      chk("[proteus][JitEngineDevice] StorageCache rank 0 hits 0 accesses 1", prefix="CHECK-FIRST", line=11),
                      chk("[proteus][JitEngineDevice] StorageCache rank 0 hits 1 accesses 1", prefix="CHECK-SECOND", line=12),
                      chk("[proteus][JitEngineHost] MemoryCache rank 0 hits 0 accesses 0", line=13),
                      chk("never printed", prefix="CHECK-THIRD", line=14)]}
OUT_FIRST = "Kernel 42\n[proteus][JitEngineDevice] StorageCache rank 0 hits 0 accesses 1\n"


def test_run_line_verdicts():
    first, second = line({}, ("CHECK-FIRST",)), line({}, ("CHECK", "CHECK-SECOND"))
    ok = checks.judge_line(PROGRAM, first, OUT_FIRST, 0, 1.0)
    assert ok["verdict"] == "pass" and ok["detail"] == "" and ok["expected"] is None
    # trace lines are checked too: the second run must see the first one's cache
    bad = checks.judge_line(PROGRAM, line({}, ("CHECK-FIRST", "CHECK-SECOND")), OUT_FIRST, 0, 1.0)
    assert bad["verdict"] == "CHECK-FAILED" and bad["failing_line"] == 12 and "hits 1 accesses 1" in bad["detail"]
    crash = checks.judge_line(PROGRAM, first, OUT_FIRST, -6, 1.0, "SIGABRT: boom")
    assert crash["verdict"] == "CRASH" and crash["detail"] == "SIGABRT: boom" and crash["check_failure"] == ""
    assert checks.judge_line(PROGRAM, first, "", "timeout", 60.0)["verdict"] == "TIMEOUT"
    # nonzero exit with failing checks: a crash, the check failure kept beside it
    both = checks.judge_line(PROGRAM, second, "", 3, 1.0)
    assert both["verdict"] == "CRASH" and "Kernel 42" in both["check_failure"]


def test_known_differences_label_failures_without_hiding_them():
    both = "Kernel 42\n[proteus][JitEngineDevice] StorageCache rank 0 hits 1 accesses 1\n"
    # [proteus][JitEngineHost] is in KNOWN_DIFFERENCES: the only failure, so expected
    res = checks.judge_line(PROGRAM, line({}, ("CHECK", "CHECK-SECOND")), both, 0, 1.0)
    assert res["verdict"] == "CHECK-FAILED" and res["failing_line"] == 13
    assert "JitEngineHost" in res["expected"]
    # a known difference first, an unexplained failure behind it: unexplained, the latter named
    res = checks.judge_line(PROGRAM, line({}, ("CHECK", "CHECK-THIRD")), both, 0, 1.0)
    assert res["expected"] is None and res["failing_line"] == 14 and "JitEngineHost" in res["also_known"]
    # an unexplained failure first
    res = checks.judge_line(PROGRAM, line({}, ("CHECK", "CHECK-FIRST")), "Kernel 41\n", 0, 1.0)
    assert res["expected"] is None and res["failing_line"] == 10


def test_known_differences_point_at_upstream_directives(doc):
    """Each KNOWN_DIFFERENCES entry names directives programs.json has (upstream moved: look again)."""
    kept = [p for p in doc["programs"] if not p["excluded"]]
    for known in checks.KNOWN_DIFFERENCES:
        assert known["reason"] and "\n" not in known["reason"]
        if "pattern" in known:
            assert any(re.search(known["pattern"], c["pattern"]) for p in kept for c in p["checks"]), known
        else:
            for source, at in known["at"].items():
                lines = {c["line"] for p in kept if p["expected_output_source"] == source for c in p["checks"]}
                assert set(at) <= lines, (source, at)
    enable_disable = next(p for p in kept if p["name"] == "enable_disable")
    labelled = [c["pattern"] for c in enable_disable["checks"] if checks.known_reason(enable_disable, c)]
    assert labelled[:2] == ["[proteus][JitEngineDevice] MemoryCache rank 0 hits 1 accesses 2",
                            "[proteus][JitEngineDevice] MemoryCache rank 0 HashValue {{[0-9]+}} NumExecs 2 NumHits 1"]


def test_markdown_table_of_run_lines():
    runs = [{**checks.line_record(1, line({"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TRACE_OUTPUT": "cache-stats"})),
             "verdict": "pass", "detail": ""},
            {**checks.line_record(2, line({"PROTEUS_CACHE_DIR": "%t.$$.proteus"}, fresh=False, stderr_too=True)),
             "verdict": "CHECK-FAILED", "detail": "CHECK: a|b (source line 9): not found", "failing_line": 9,
             "expected": "no host JIT"},
            {**checks.line_record(1, line({})), "verdict": "CHECK-FAILED", "detail": "CHECK: x (source line 3)"},
            {**checks.line_record(2, line({})), "verdict": "CRASH", "detail": "exit 3", "check_failure": "CHECK: y"}]
    results = [{"name": "a", "upstream_runs": runs[:2]}, {"name": "b", "upstream_runs": runs[2:]}]
    md = "\n".join(checks.markdown_runs(results))
    assert "## Upstream's RUN lines" in md
    assert ("RUN lines passing: 1/4; failing, expected: 1; failing, unexplained: 2. "
            "Not passing, by verdict: CHECK-FAILED 2, CRASH 1") in md
    assert "| a | 1 | PROTEUS_TRACE_OUTPUT=cache-stats (fresh cache) | pass |  |" in md
    assert ("| a | 2 | (earlier lines' cache) 2>&1 | CHECK-FAILED (expected: no host JIT) | "
            "CHECK: a\\|b (source line 9): not found |") in md
    assert "| b | 2 |  | CRASH | exit 3; CHECK: y |" in md
    assert checks.markdown_runs([{"name": "a"}]) == []  # --native-only: no section


# --- run.py end to end: RUN lines with fake programs, then --recheck with LLVM's FileCheck -------

LINES_PROGRAM = r"""#!/bin/sh
# A fake GPU program with a fake cache: "hits 1" when an earlier run under the tool left an entry.
name=$(basename "$0")
hits=0
if [ -n "$LD_PRELOAD" ] && [ -n "$PROTEUS_CACHE_DIR" ]; then
  [ -e "$PROTEUS_CACHE_DIR/entry" ] && hits=1
  mkdir -p "$PROTEUS_CACHE_DIR" && touch "$PROTEUS_CACHE_DIR/entry"
fi
echo "Kernel 42"
case "$name" in
  tuned) cat "$PROTEUS_TUNED_KERNELS" ;;
  crash) [ -n "$LD_PRELOAD" ] && exit 3 ;;
  hang) [ -n "$LD_PRELOAD" ] && sleep 30 ;;
esac
case "$PROTEUS_TRACE_OUTPUT" in
  *cache-stats*) echo "[proteus][JitEngineDevice] StorageCache rank 0 hits $hits accesses 1" ;;
esac
[ -n "$LD_PRELOAD" ] && echo "async=$PROTEUS_ASYNC_COMPILATION" >&2
exit 0
"""

CACHED = {"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TRACE_OUTPUT": "cache-stats"}
FIRST = "[proteus][JitEngineDevice] StorageCache rank 0 hits 0 accesses 1"
SECOND = "[proteus][JitEngineDevice] StorageCache rank 0 hits 1 accesses 1"
HOST = "[proteus][JitEngineHost] MemoryCache rank 0 hits 0 accesses 0"
LINES_PROGRAMS = {
    "cached": ([line(CACHED, ("CHECK", "CHECK-FIRST")), line(CACHED, ("CHECK", "CHECK-SECOND"), fresh=False),
                line(CACHED, ("CHECK", "CHECK-FIRST"))],
               [chk("Kernel 42"), chk(FIRST, prefix="CHECK-FIRST"), chk(SECOND, prefix="CHECK-SECOND")]),
    "stderr": ([line({}, ("CHECK-ERR",), stderr_too=True), line({}, ("CHECK-ERR",)),
                line({"PROTEUS_ASYNC_COMPILATION": "1"}, ("CHECK-ASYNC",), stderr_too=True)],
               [chk("Kernel 42", prefix="CHECK-ERR"), chk("async=0", prefix="CHECK-ERR"),
                chk("Kernel 42", prefix="CHECK-ASYNC"), chk("async=1", prefix="CHECK-ASYNC")]),
    "tuned": ([line({"PROTEUS_TUNED_KERNELS": "%S/tuned_config.json"})], [chk("Kernel 42"), chk('"tuned": 1')]),
    "missing": ([line({"PROTEUS_TUNED_KERNELS": "%S/absent.json"})], [chk("Kernel 42")]),
    "known": ([line(CACHED, ("CHECK", "CHECK-FIRST")), line(CACHED, ("CHECK", "CHECK-FIRST"), fresh=False)],
              [chk("Kernel 42"), chk(HOST), chk(FIRST, prefix="CHECK-FIRST")]),
    "crash": ([line({})], [chk("Kernel 42")]),
    "hang": ([line({})], [chk("Kernel 42")]),
}


def source_text(checks_: list[dict]) -> str:
    """An upstream-like test file holding the directives at their line numbers."""
    text = [""] * max(c["line"] for c in checks_)
    for c in checks_:
        directive = {"CHECK": "", "COUNT": f"-COUNT-{c['count']}"}.get(c["directive"], "-" + c["directive"])
        text[c["line"] - 1] = f"// {c['prefix']}{directive}: {c['pattern']}"
    return "\n".join(text) + "\n"


@pytest.fixture(scope="module")
def lines_e2e(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("upstream-lines")
    gpu = tmp / "work" / "src" / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "tuned_config.json").write_text('{"tuned": 1}\n')
    programs = []
    for name, (runs, checks_) in LINES_PROGRAMS.items():
        for recipe in ("plain", "recommended"):
            executable(tmp / "work" / "build" / recipe / name, LINES_PROGRAM)
        checks_ = [{**c, "line": 20 + i} for i, c in enumerate(checks_)]
        (gpu / f"{name}.cpp").write_text(source_text(checks_))
        programs.append({"name": name, "source": f"tests/gpu/{name}.cpp", "expected_output_source": f"tests/gpu/{name}.cpp",
                         "args": [], "excluded": None, "runs": runs, "checks": checks_})
    (tmp / "programs.json").write_text(json.dumps({"upstream": {"commit": "0" * 40}, "programs": programs}))
    # libproteus.so: a library the programs load anyway (an empty file makes ld.so complain on stderr)
    libc = next(l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in l)
    tool = executable(tmp / "fake-rewrite", f'#!/bin/sh\nmkdir -p "$3" && ln -sf {libc} "$3/libproteus.so"\n')
    rc = run.main(["--work", str(tmp / "work"), "--programs", str(tmp / "programs.json"), "--tool", str(tool),
                   "--out", str(tmp / "out"), "-j", "4", "--timeout", "2", "--nvidia-smi", "/nonexistent"])
    doc = json.loads((tmp / "out" / "upstream-tests.json").read_text())
    return {"rc": rc, "tmp": tmp, "out": tmp / "out", "md": (tmp / "out" / "upstream-tests.md").read_text(),
            "runs": {p["name"]: p["upstream_runs"] for p in doc["programs"]}}


def test_e2e_run_lines_verdicts(lines_e2e):
    assert lines_e2e["rc"] == 0
    verdicts = {n: [r["verdict"] for r in runs] for n, runs in lines_e2e["runs"].items()}
    assert verdicts == {"cached": ["pass", "pass", "pass"],  # the third line's rm -rf emptied the cache
                        "stderr": ["pass", "CHECK-FAILED", "pass"], "tuned": ["pass"], "missing": ["NOT-RUN"],
                        "known": ["CHECK-FAILED", "CHECK-FAILED"], "crash": ["CRASH"], "hang": ["TIMEOUT"]}
    runs = lines_e2e["runs"]
    assert runs["cached"][1]["env"]["PROTEUS_CACHE_DIR"].endswith("/scratch/cached/upstream.proteus")
    assert runs["cached"][1]["env"]["LD_PRELOAD"].endswith("/tool/libproteus.so")
    assert "async=0" in runs["stderr"][1]["detail"]
    assert "absent.json" in runs["missing"][0]["detail"]
    # only the known difference fails / behind it, the cache's hits fail too: not explained
    assert "JitEngineHost" in runs["known"][0]["expected"] and runs["known"][0]["failing_line"] == 21
    assert runs["known"][1]["expected"] is None and runs["known"][1]["failing_line"] == 22
    assert "JitEngineHost" in runs["known"][1]["also_known"]
    assert "exit 3" in runs["crash"][0]["detail"]


def test_e2e_run_lines_outputs_are_saved_whole(lines_e2e):
    saved = lines_e2e["out"] / "upstream-runs"
    assert (saved / "cached.2.txt").read_text() == f"Kernel 42\n{SECOND}\n"
    assert (saved / "stderr.1.txt").read_text() == "Kernel 42\nasync=0\n"  # 2>&1: stderr after stdout
    assert (saved / "stderr.2.txt").read_text() == "Kernel 42\n" and (saved / "stderr.2.stderr").exists()
    assert lines_e2e["runs"]["cached"][1]["output_file"] == "upstream-runs/cached.2.txt"
    assert not (saved / "missing.1.txt").exists()


def test_e2e_run_lines_table(lines_e2e):
    md = lines_e2e["md"]
    assert "RUN lines passing: 6/12; failing, expected: 1; failing, unexplained: 5" in md
    assert "| cached | 2 | PROTEUS_TRACE_OUTPUT=cache-stats (earlier lines' cache) | pass |" in md
    assert "| known | 1 | PROTEUS_TRACE_OUTPUT=cache-stats (fresh cache) | CHECK-FAILED (expected: " in md


@pytest.mark.skipif(not Path(FILECHECK).exists(), reason=f"no LLVM FileCheck at {FILECHECK}")
def test_recheck_with_filecheck_agrees_with_the_builtin_checker(lines_e2e):
    assert run.main(["--recheck", str(lines_e2e["out"]), "--filecheck", FILECHECK, "--programs",
                     str(lines_e2e["tmp"] / "programs.json"), "--sources", str(lines_e2e["tmp"] / "work" / "src")]) == 0
    doc = json.loads((lines_e2e["out"] / "upstream-filecheck.json").read_text())
    rows = {(r["program"], r["n"]): r for r in doc["runs"]}
    assert len(rows) == 12 and "19." in doc["filecheck_version"]
    assert rows[("missing", 1)]["filecheck"] == "not-run"
    assert rows[("cached", 3)]["filecheck"] == "pass"
    assert rows[("stderr", 2)]["filecheck"] == "FAIL" and rows[("stderr", 2)]["source_line"] == 21
    assert all(r.get("agrees_with_builtin", True) for r in rows.values()), rows
    assert "JitEngineHost" in rows[("known", 1)]["expected"]  # FileCheck passes with it blanked out
    assert rows[("known", 2)]["expected"] is None and rows[("known", 2)]["source_line"] == 21
    md = (lines_e2e["out"] / "upstream-filecheck.md").read_text()
    assert "disagreeing with run.py's checker: 0" in md and "| known | 1 | CHECK,CHECK-FIRST | CHECK-FAILED | FAIL (expected: " in md


@pytest.mark.skipif(not Path(FILECHECK).exists(), reason=f"no LLVM FileCheck at {FILECHECK}")
def test_recheck_on_kernel_cache_checks(tmp_path, doc):
    """Upstream's kernel_cache directives (from programs.json, at their line numbers), outputs that
    pass and that fail, as run.py would have saved them."""
    program = next(p for p in doc["programs"] if p["name"] == "kernel_cache")
    src = tmp_path / "src"
    (src / "tests" / "gpu").mkdir(parents=True)
    (src / program["expected_output_source"]).write_text(source_text(program["checks"]))
    stats = ["[proteus][JitEngineDevice] MemoryCache rank 0 hits 9 accesses 10",
             "[proteus][JitEngineDevice] MemoryCache rank 0 HashValue 123456 NumExecs 10 NumHits 9",
             "[proteus][JitEngineDevice] StorageCache rank 0 hits 0 accesses 1"]
    outputs = ["Kernel\n" * 10 + "\n".join(stats) + "\n",  # CHECK,CHECK-FIRST: passes
               "Kernel\n" * 10 + "\n".join(stats) + "\n",  # CHECK,CHECK-SECOND: the storage cache missed
               "Kernel\n" * 11 + "\n".join(stats) + "\n"]  # one Kernel too many: CHECK-NOT
    (tmp_path / "upstream-runs").mkdir()
    runs = []
    for n, (text, up) in enumerate(zip(outputs, program["runs"]), 1):
        (tmp_path / "upstream-runs" / f"kernel_cache.{n}.txt").write_text(text)
        prefixes = up["check_prefixes"] if n < 3 else ["CHECK", "CHECK-FIRST"]
        result = checks.judge_line(program, {**up, "check_prefixes": prefixes}, text, 0, 1.0)
        runs.append({**checks.line_record(n, {**up, "check_prefixes": prefixes}), **result,
                     "output_file": f"upstream-runs/kernel_cache.{n}.txt"})
    assert [r["verdict"] for r in runs] == ["pass", "CHECK-FAILED", "CHECK-FAILED"]
    (tmp_path / "upstream-tests.json").write_text(json.dumps({"programs": [
        {"name": "kernel_cache", "source": program["source"], "expected_output_source": program["expected_output_source"],
         "upstream_runs": runs}]}))
    assert run.main(["--recheck", str(tmp_path), "--filecheck", FILECHECK, "--sources", str(src)]) == 0
    rows = json.loads((tmp_path / "upstream-filecheck.json").read_text())["runs"]
    by_line = {c["line"]: c for c in program["checks"]}
    assert [r["filecheck"] for r in rows] == ["pass", "FAIL", "FAIL"]
    assert by_line[rows[1]["source_line"]]["prefix"] == "CHECK-SECOND" and rows[1]["source_line"] == runs[1]["failing_line"]
    assert by_line[rows[2]["source_line"]]["directive"] == "NOT" and rows[2]["source_line"] == runs[2]["failing_line"]
    assert all(r["agrees_with_builtin"] for r in rows)
    assert "error:" in rows[1]["error"]


@pytest.mark.skipif(not Path(FILECHECK).exists(), reason=f"no LLVM FileCheck at {FILECHECK}")
def test_recheck_explains_a_known_line_whose_variable_a_kept_line_uses(tmp_path, doc):
    """global_var_register: a [GVarInfo] directive (a known difference) defines [[SZ_CHAR]], which
    the next, kept directive uses; blanked, its uses match what it would have defined."""
    program = next(p for p in doc["programs"] if p["name"] == "global_var_register")
    src = tmp_path / "src"
    (src / "tests" / "gpu").mkdir(parents=True)
    (src / program["expected_output_source"]).write_text(source_text(program["checks"]))
    up = program["runs"][0]
    text = "".join(f"{v} has size of {n}\n" for v, n in (("CharVar", 1), ("IntVar", 4), ("LongVar", 8), ("FloatVar", 4),
                                                        ("DoubleVar", 8), ("LSVar", 112), ("SSVar", 12)))
    (tmp_path / "upstream-runs").mkdir()
    (tmp_path / "upstream-runs" / "global_var_register.1.txt").write_text(text)
    result = checks.judge_line(program, up, text, 0, 1.0)
    (tmp_path / "upstream-tests.json").write_text(json.dumps({"programs": [
        {"name": program["name"], "source": program["source"], "expected_output_source": program["expected_output_source"],
         "upstream_runs": [{**checks.line_record(1, up), **result, "output_file": "upstream-runs/global_var_register.1.txt"}]}]}))
    assert run.main(["--recheck", str(tmp_path), "--filecheck", FILECHECK, "--sources", str(src)]) == 0
    (row,) = json.loads((tmp_path / "upstream-filecheck.json").read_text())["runs"]
    assert row["filecheck"] == "FAIL" and "GVarInfo" in (row["expected"] or ""), row
