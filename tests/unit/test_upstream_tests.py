"""bench/upstream_tests: run.py's FileCheck subset and output comparison, run.py end to end
against fake programs (shell scripts) and a fake proteus-rewrite, upstream's RUN lines under the
tool (checks.py: lit's substitutions, verdicts, known differences, their table) and --recheck
with LLVM's FileCheck (skipped without it), build.py's reading of upstream's CMakeLists and lit
files and --pack, and programs.json (well-formed; its sources exist upstream when the mirror is
here). No GPU, no clang."""

from __future__ import annotations

import json
import re
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.scripts import load_script

UPSTREAM_TESTS = Path(__file__).resolve().parents[2] / "bench" / "upstream_tests"


def _load(name: str):
    return load_script(UPSTREAM_TESTS / f"{name}.py", f"upstream_tests_{name}")


run = _load("run")
build = _load("build")


def chk(pattern: str, directive: str = "CHECK", count: int = 1, prefix: str = "CHECK", line: int = 1) -> dict:
    return {"prefix": prefix, "directive": directive, "count": count, "pattern": pattern, "line": line}


# --- the FileCheck subset --------------------------------------------------------------------

def test_checks_match_in_order_as_substrings():
    text = "Kernel body\nx[0] = 3.14\nVerification successful\n"
    assert run.filecheck(text, [chk("Kernel"), chk("x[0] = 3.14"), chk("successful")]) == []
    failures = run.filecheck(text, [chk("x[0] = 3.14"), chk("Kernel body", line=7)])
    assert len(failures) == 1 and "Kernel body" in failures[0] and "line 7" in failures[0]
    assert run.filecheck("Kernel 41\n", [chk("Kernel 42")])


def test_regex_blocks_and_blank_runs():
    assert run.filecheck("Kernel Index 256/1024\n", [chk("Kernel Index {{[0-9]+}}/1024")]) == []
    assert run.filecheck("Kernel Index x/1024\n", [chk("Kernel Index {{[0-9]+}}/1024")])
    assert run.filecheck("a    =  1\n", [chk("a = 1")]) == []
    assert run.filecheck("call sreg.tid.x\n", [chk("call {{llvm.amdgcn.workitem.id.x|sreg.tid.x}}")]) == []
    # a regex never reaches into the next line
    assert run.filecheck("Kernel\nIndex\n", [chk("Kernel{{.*}}Index")])


def test_count_and_not_are_counted_exactly():
    ten = "Kernel\n" * 10
    checks = [chk("Kernel", "COUNT", 10), chk("Kernel", "NOT")]  # kernel_cache.cpp's pair
    assert run.filecheck(ten, checks) == []
    assert run.filecheck(ten + "Kernel\n", checks)
    assert run.filecheck("Kernel\n" * 9, checks)
    between = [chk("0"), chk("thread_privatize", "NOT"), chk("19.4767")]
    assert run.filecheck("0\n19.4767\n", between) == []
    assert "thread_privatize" in run.filecheck("0\ncall thread_privatize\n19.4767\n", between)[0]


def test_next_and_same_lines():
    assert run.filecheck("a\nb\n", [chk("a"), chk("b", "NEXT")]) == []
    assert run.filecheck("a\nx\nb\n", [chk("a"), chk("b", "NEXT")])
    assert run.filecheck("a b\n", [chk("a"), chk("b", "SAME")]) == []
    assert run.filecheck("a\nb\n", [chk("a"), chk("b", "SAME")])


def test_dag_matches_any_order_without_overlap():
    text = "Kernel Index 512/1024\nKernel Index 0/1024\n"
    dags = [chk("Kernel Index 0/1024", "DAG"), chk("Kernel Index 512/1024", "DAG")]
    assert run.filecheck(text, dags) == []
    assert run.filecheck("x\n", [chk("x", "DAG"), chk("x", "DAG")])  # one line cannot match twice
    # what follows a DAG group comes after its furthest match
    assert run.filecheck(text + "done\n", [*dags, chk("done")]) == []
    assert run.filecheck("done\n" + text, [*dags, chk("done")])


def test_variables_bind_and_must_repeat():
    checks = [chk("gvar 24 addr [[ADDR:[a-z0-9]+]]"), chk("gvar 25 addr [[ADDR]]")]
    assert run.filecheck("gvar 24 addr 0x7f00\ngvar 25 addr 0x7f00\n", checks) == []
    assert run.filecheck("gvar 24 addr 0x7f00\ngvar 25 addr 0x7f08\n", checks)
    # defined only on a trace line (not checked here): bound where first used, then held to it
    sizes = [chk("CharVar has size of [[SZ]]", "DAG"), chk("again [[SZ]]")]
    assert run.filecheck("CharVar has size of 1\nagain 1\n", sizes) == []
    assert run.filecheck("CharVar has size of 1\nagain 4\n", sizes)


def test_output_checks_drop_trace_lines_and_keep_every_run_prefix():
    program = {"runs": [{"check_prefixes": ["CHECK-FIRST"]}, {"check_prefixes": ["CHECK", "CHECK-SECOND"]}],
               "checks": [chk("[ArgSpec] Replaced Function _Z6kerneli ArgNo 0", prefix="CHECK-FIRST"),
                          chk("Kernel 42"),
                          chk("[proteus][JitEngineDevice] MemoryCache rank 0 hits 0 accesses 1"),
                          chk("first only", prefix="CHECK-FIRST"),
                          chk("never run", prefix="CHECK-THIRD")]}
    assert [c["pattern"] for c in run.output_checks(program)] == ["Kernel 42", "first only"]


def test_masked_comparison():
    masks = [r"(?<=addr )(0x)?[0-9a-f]+"]
    a = run.masked("Kernel gvar 24 addr 0x7f00  \n", masks)
    assert a == ["Kernel gvar 24 addr <masked>"]
    assert run.first_difference(a, run.masked("Kernel gvar 24 addr 0x1234\n", masks)) is None
    assert "line 1" in run.first_difference(a, run.masked("Kernel gvar 25 addr 0x7f00\n", masks))
    assert "line 2" in run.first_difference(["a"], ["a", "extra"])


def test_kernel_counts(tmp_path):
    trace = tmp_path / "k.txt"
    trace.write_text("_Z6kernelv\n_Z6kernelv$proteus$1a2b\n_Z6kernelv$proteus$1a2b\n")
    assert run.kernel_counts(trace) == {"variants": 2, "originals": 1}
    assert run.kernel_counts(tmp_path / "missing.txt") is None


# --- run.py end to end, with fake programs and a fake tool -----------------------------------

FAKE_PROGRAM = r"""#!/bin/sh
# A fake GPU program: what it prints depends on its name and on whether it runs under the tool.
name=$(basename "$0")
[ -n "$PROTEUS_DISABLE" ] && exit 9          # the caller's PROTEUS_* must not reach any run
tool=
if [ -n "$LD_PRELOAD" ]; then
  tool=1
  # under the tool, run.py must give all of these
  [ "$PROTEUS_ASYNC_COMPILATION" = 0 ] && [ -n "$PROTEUS_CACHE_DIR" ] && [ -n "$PROTEUS_REPORT" ] || exit 5
  mkdir -p "$PROTEUS_CACHE_DIR"
  warm=; [ -e "$PROTEUS_CACHE_DIR/entry" ] && warm=1
  touch "$PROTEUS_CACHE_DIR/entry"
  echo '{"kernels": [{"launches": 2, "specialized_launches": 1}]}' > "$PROTEUS_REPORT"
fi
if [ -n "$CUPTI_KERNEL_TRACE_FILE" ]; then
  if [ -n "$tool" ]; then printf '_Z6kerneli$proteus$ab\n_Z6kerneli\n' > "$CUPTI_KERNEL_TRACE_FILE"
  else printf '_Z6kerneli\n_Z6kerneli\n' > "$CUPTI_KERNEL_TRACE_FILE"; fi
fi
echo "Kernel start"
case "$name" in
  good) echo "Kernel 42" ;;
  diff) if [ -n "$tool" ]; then echo "Kernel 41"; else echo "Kernel 42"; fi ;;
  crash) echo "Kernel 42"; [ -n "$tool" ] && exit 3 ;;
  hang) echo "Kernel 42"; [ -n "$tool" ] && sleep 30 ;;
  nocheck) echo "Kernel 0" ;;
  norewrite) echo "Kernel 42" ;;
  warmdiff) if [ -n "$warm" ]; then echo "Kernel 43"; else echo "Kernel 42"; fi ;;
esac
exit 0
"""

FAKE_TOOL = r"""#!/bin/sh
# proteus-rewrite EXE -o DIR
case "$1" in *norewrite) echo "no bitcode in $1" >&2; exit 2 ;; esac
mkdir -p "$3" && : > "$3/libproteus.so"
"""


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


NAMES = ("good", "diff", "crash", "hang", "nocheck", "norewrite", "warmdiff")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("upstream")
    for recipe in ("plain", "recommended"):
        for name in NAMES:
            _executable(tmp / "work" / "build" / recipe / name, FAKE_PROGRAM)
    tool = _executable(tmp / "fake-rewrite", FAKE_TOOL)
    programs = [{"name": n, "source": f"tests/gpu/{n}.cpp", "args": [], "excluded": None,
                 "runs": [{"check_prefixes": ["CHECK"]}],
                 "checks": [chk("Kernel 42"), chk("[proteus][JitEngineDevice] MemoryCache rank 0 hits 0")]}
                for n in NAMES]
    programs.append({"name": "left_out", "source": "tests/gpu/x.cpp", "args": [], "excluded": "needs the plugin"})
    (tmp / "programs.json").write_text(json.dumps({"upstream": {"commit": "0" * 40}, "programs": programs}))
    env_before = dict(os.environ)
    os.environ["PROTEUS_DISABLE"] = "1"
    try:
        rc = run.main(["--work", str(tmp / "work"), "--programs", str(tmp / "programs.json"), "--tool", str(tool),
                       "--out", str(tmp / "out"), "-j", "4", "--timeout", "2", "--kernel-trace-lib", str(tool),
                       "--nvidia-smi", "/nonexistent"])
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    doc = json.loads((tmp / "out" / "upstream-tests.json").read_text())
    return {"rc": rc, "doc": doc, "by_name": {p["name"]: p for p in doc["programs"]},
            "md": (tmp / "out" / "upstream-tests.md").read_text()}


def test_e2e_every_program_gets_a_verdict(e2e):
    assert e2e["rc"] == 0
    assert set(e2e["by_name"]) == set(NAMES)  # excluded programs are not run
    verdicts = {n: p["verdict"] for n, p in e2e["by_name"].items()}
    assert verdicts == {"good": "ok", "diff": "cold: DIFF", "crash": "cold: CRASH", "hang": "cold: TIMEOUT",
                        "nocheck": "native-check-failed", "norewrite": "REWRITE-FAILED", "warmdiff": "warm: DIFF"}


def test_e2e_good_program_runs_natively_then_cold_then_warm(e2e):
    good = e2e["by_name"]["good"]
    assert set(good["runs"]) == {"native-plain", "native-recommended", "rewrite", "cold", "warm"}
    native = good["runs"]["native-recommended"]
    assert native["rc"] == 0 and native["check_failures"] == [] and native["same_as_plain"] is True
    assert "LD_PRELOAD" not in native["env"]
    for mode in ("cold", "warm"):
        r = good["runs"][mode]
        assert r["verdict"] == "ok" and r["env"]["PROTEUS_ASYNC_COMPILATION"] == "0"
        assert r["env"]["LD_PRELOAD"].endswith("/tool/libproteus.so")
        assert r["kernels"] == {"variants": 1, "originals": 1}
        assert r["report"]["specialized_launches"] == 1 and r["report"]["launches"] == 2
    assert good["runs"]["cold"]["env"]["PROTEUS_CACHE_DIR"] == good["runs"]["warm"]["env"]["PROTEUS_CACHE_DIR"]
    assert native["kernels"] == {"variants": 0, "originals": 2}


def test_e2e_failures_say_what_happened(e2e):
    by = e2e["by_name"]
    assert "Kernel 41" in by["diff"]["detail"]
    assert "exit 3" in by["crash"]["detail"]
    assert by["hang"]["runs"]["cold"]["rc"] == "timeout" and by["hang"]["runs"]["cold"]["seconds"] < 20
    assert "Kernel 42" in by["nocheck"]["detail"] and "cold" not in by["nocheck"]["runs"]
    assert "no bitcode" in by["norewrite"]["detail"]
    assert by["warmdiff"]["runs"]["cold"]["verdict"] == "ok"  # the cold run's cache was empty


def test_e2e_markdown_table_has_a_row_per_program(e2e):
    first_table = e2e["md"].split("## Upstream's RUN lines")[0]
    rows = [l for l in first_table.splitlines() if l.startswith("| ") and not l.startswith("| program")]
    assert len(rows) == len(NAMES)
    good = next(r for r in rows if r.startswith("| good |"))
    assert "| ok | ok | 1/1 | 1/1 | 1/2 |" in good


# --- build.py: upstream's CMakeLists and lit files -------------------------------------------

CMAKE = """
function(CREATE_GPU_TEST exe check_source)
    add_executable(${exe}.${lang} ${check_source})
endfunction()
if(PROTEUS_ENABLE_HIP)
    SET(lang HIP)
elseif(PROTEUS_ENABLE_CUDA)
    SET(lang CUDA)
endif()
file(WRITE lit.cfg.py "config.substitutions.append(('%ext', ext)) # not a comment")
CREATE_GPU_TEST(kernel kernel.cpp) # a comment (with parentheses)
CREATE_GPU_TEST(multi file1.cpp
                file2.cpp)
if(PROTEUS_ENABLE_HIP)
    CREATE_GPU_TEST(hip_only hip_only.cpp)
elseif(PROTEUS_ENABLE_CUDA)
    if(LLVM_VERSION_MAJOR VERSION_GREATER_EQUAL 18 AND LLVM_VERSION_MAJOR VERSION_LESS 22)
        CREATE_GPU_TEST(alias_func alias_func.cpp)
    endif()
endif()
CREATE_GPU_LIBRARY(device_func_lib device_func.cpp)
CREATE_GPU_TEST_RDC_LIBS(calls device_func_lib calls.cpp)
add_subdirectory(sub)
"""


def test_cmake_targets_for_cuda():
    files = {"tests/gpu/CMakeLists.txt": CMAKE,
             "tests/gpu/sub/CMakeLists.txt": "CREATE_PROTEUS_GPU_LIBRARY(lib a.cpp b.cpp)\nCREATE_GPU_TEST_LIBS(s lib main.cpp)\n"}
    targets = {t["name"]: t for t in build.cuda_targets(files.__getitem__, 19)}
    assert list(targets) == ["kernel", "multi", "alias_func", "calls.rdc", "s"]
    assert targets["multi"]["sources"] == ["file1.cpp", "file2.cpp"]
    assert targets["calls.rdc"]["rdc"] and targets["calls.rdc"]["libraries"] == [
        {"name": "device_func_lib", "sources": ["device_func.cpp"]}]
    assert targets["s"]["sources"] == ["sub/main.cpp"] and not targets["s"]["rdc"]
    assert targets["s"]["libraries"][0]["sources"] == ["sub/a.cpp", "sub/b.cpp"]
    assert "alias_func" not in {t["name"] for t in build.cuda_targets(files.__getitem__, 22)}


def test_cmake_condition_refuses_what_it_does_not_know():
    assert build.cmake_condition(["NOT", "PROTEUS_ENABLE_HIP"], {"PROTEUS_ENABLE_HIP": False})
    with pytest.raises(ValueError):
        build.cmake_condition(["SOMETHING_NEW"], {})


LIT = """// RUN: rm -rf "%t.$$.proteus"
// RUN: PROTEUS_CACHE_DIR="%t.$$.proteus" PROTEUS_TRACE_OUTPUT="specialization;cache-stats" %build/prog.%ext | %FILECHECK %s --check-prefixes=CHECK-FIRST
// RUN: PROTEUS_CACHE_DIR="%t.$$.proteus" %build/prog.%ext 2>&1 | %FILECHECK %s --check-prefixes=CHECK,CHECK-%device_lang
// RUN: %build/other.%ext | %FILECHECK %s
// NOTE: not a check
// CHECK-FIRST-NEXT: [ObjectCacheChain] Chain
// CHECK-COUNT-3: Kernel
// CHECK-CUDA: cuda only
// CHECK-HIP: hip only
"""


def test_lit_run_and_check_lines():
    runs = build.parse_runs(LIT, "prog")
    assert [(r["fresh_cache"], r["check_prefixes"], r["stderr_too"]) for r in runs] == [
        (True, ["CHECK-FIRST"], False), (False, ["CHECK", "CHECK-CUDA"], True)]
    assert runs[0]["env"] == {"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}
    checks = build.parse_checks(LIT, {"CHECK", "CHECK-FIRST", "CHECK-CUDA"})
    assert [(c["prefix"], c["directive"], c["count"], c["pattern"]) for c in checks] == [
        ("CHECK-FIRST", "NEXT", 1, "[ObjectCacheChain] Chain"), ("CHECK", "COUNT", 3, "Kernel"),
        ("CHECK-CUDA", "CHECK", 1, "cuda only")]


# --- programs.json -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc() -> dict:
    return build.load_programs()


def test_programs_json_is_well_formed(doc):
    assert build.validate(doc) == []
    assert len(doc["upstream"]["commit"]) == 40
    kept = [p for p in doc["programs"] if not p["excluded"]]
    assert len(kept) >= 70
    for p in kept:
        assert p["expected_output_source"] == p["source"] and p["runs"] and p["args"] == []
    for p in doc["programs"]:
        assert p["excluded"] is None or (p["excluded"].strip() and "\n" not in p["excluded"])


def test_a_broken_programs_json_is_named(doc):
    good = next(p for p in doc["programs"] if not p["excluded"])
    bad = {"programs": [good, good, {**good, "name": "x", "runs": [], "mask": ["("]},
                        {**good, "name": "y", "excluded": "two\nlines"}]}
    problems = build.validate(bad)
    assert any("listed twice" in p for p in problems)
    assert any(p.startswith("x: no RUN line") for p in problems)
    assert any(p.startswith("x: mask") for p in problems)
    assert any(p.startswith("y: excluded") for p in problems)


def test_programs_json_sources_exist_upstream(doc):
    mirror = Path(os.environ.get("PROTEUS_UPSTREAM_MIRROR", build.DEFAULT_MIRROR))
    if not mirror.is_dir():
        pytest.skip(f"no mirror of upstream Proteus at {mirror}")
    commit = doc["upstream"]["commit"]
    listing = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "-r", "--name-only", commit, build.TESTS_DIR],
                             capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"the mirror lacks commit {commit}")
    files = set(listing.stdout.split())
    for p in doc["programs"]:
        if p["excluded"]:
            continue
        assert p["source"] in files, p["name"]
        sources = p["sources"] + [s for lib in p["libraries"] for s in lib["sources"]]
        missing = [s for s in sources if f"{build.TESTS_DIR}/{s}" not in files]
        assert not missing, (p["name"], missing)


def test_order_free_only_where_upstream_checks_with_dag():
    lines = "Kernel Index 256/1024\nKernel Index 0/1024\n"
    swapped = "Kernel Index 0/1024\nKernel Index 256/1024\n"
    dag = {"runs": [{"check_prefixes": ["CHECK"]}],
           "checks": [chk("Kernel Index 0/1024", directive="DAG"), chk("Kernel Index 256/1024", directive="DAG")]}
    ordered = {"runs": [{"check_prefixes": ["CHECK"]}], "checks": [chk("Kernel Index 0/1024")]}
    assert run.first_difference(run.comparable(lines, dag), run.comparable(swapped, dag)) is None
    assert run.first_difference(run.comparable(lines, dag), run.comparable("Kernel Index 0/1024\n", dag))
    assert run.first_difference(run.comparable(lines, ordered), run.comparable(swapped, ordered))


def test_the_tarball_carries_what_run_py_imports(tmp_path):
    """build.py --pack: run.py and bench/harness.py in the layout run.py imports them from on
    the GPU host; run.py starts from the unpacked tree alone."""
    import tarfile

    work = tmp_path / "work"
    work.mkdir()
    (work / "manifest.json").write_text(json.dumps({"programs": {}}))
    out = tmp_path / "u.tar.xz"
    with pytest.raises(SystemExit, match="tuned_config.json"):  # a RUN line reads it through %S
        build.pack(out, work)
    (work / "src" / "tests" / "gpu").mkdir(parents=True)
    (work / "src" / "tests" / "gpu" / "tuned_config.json").write_text("{}\n")
    build.pack(out, work)
    with tarfile.open(out) as tar:
        assert {"harness.py", "upstream_tests/run.py", "upstream_tests/checks.py",
                "upstream_tests/work/src/tests/gpu/tuned_config.json"} <= set(tar.getnames())
        tar.extractall(tmp_path / "unpacked", filter="data")
    proc = subprocess.run([sys.executable, str(tmp_path / "unpacked" / "upstream_tests" / "run.py"), "--help"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# --- upstream's RUN lines under the tool (checks.py) ---------------------------------------------

checks = sys.modules["checks"]  # run.py imported it from beside itself
FILECHECK = os.environ.get("FILECHECK", "/usr/lib/llvm-19/bin/FileCheck")


def line(env: dict, prefixes=("CHECK",), fresh=True, stderr_too=False) -> dict:
    return {"exe": "prog", "env": env, "check_prefixes": list(prefixes), "stderr_too": stderr_too,
            "fresh_cache": fresh, "line": " ".join(f"{k}={v}" for k, v in env.items()) + " %build/prog.%ext"}


def test_run_line_env_substitutes_like_lit(tmp_path):
    cache, s_dir = tmp_path / "upstream.proteus", tmp_path / "src" / "tests" / "gpu"
    env = checks.line_env(line({"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TUNED_KERNELS": "%S/tuned_config.json",
                                "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}), cache, s_dir)
    assert env == {"PROTEUS_CACHE_DIR": str(cache), "PROTEUS_TUNED_KERNELS": f"{s_dir}/tuned_config.json",
                   "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats", "PROTEUS_ASYNC_COMPILATION": "0"}
    # upstream's default is synchronous compilation: added unless the line says otherwise
    assert checks.line_env(line({"PROTEUS_ASYNC_COMPILATION": "1"}), cache, s_dir)["PROTEUS_ASYNC_COMPILATION"] == "1"
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
            lines = {c["line"]: c for p in kept if p["expected_output_source"] == known["source"] for c in p["checks"]}
            assert set(known["lines"]) <= set(lines), known
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


def test_pack_lists_the_files_run_lines_read(doc):
    assert "tests/gpu/tuned_config.json" in build.run_line_files(doc)


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
            _executable(tmp / "work" / "build" / recipe / name, LINES_PROGRAM)
        checks_ = [{**c, "line": 20 + i} for i, c in enumerate(checks_)]
        (gpu / f"{name}.cpp").write_text(source_text(checks_))
        programs.append({"name": name, "source": f"tests/gpu/{name}.cpp", "expected_output_source": f"tests/gpu/{name}.cpp",
                         "args": [], "excluded": None, "runs": runs, "checks": checks_})
    (tmp / "programs.json").write_text(json.dumps({"upstream": {"commit": "0" * 40}, "programs": programs}))
    # libproteus.so: a library the programs load anyway (an empty file makes ld.so complain on stderr)
    libc = next(l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in l)
    tool = _executable(tmp / "fake-rewrite", f'#!/bin/sh\nmkdir -p "$3" && ln -sf {libc} "$3/libproteus.so"\n')
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
