"""bench/corpora/upstream_tests/run.py: its FileCheck subset and output comparison, and run.py end to
end against fake programs (shell scripts) and a fake proteus-rewrite: verdicts, runs, report.
No GPU, no clang."""

from __future__ import annotations

import json
import os

import pytest

from .upstream_support import chk, executable, run

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


def test_order_free_only_where_upstream_checks_with_dag():
    lines = "Kernel Index 256/1024\nKernel Index 0/1024\n"
    swapped = "Kernel Index 0/1024\nKernel Index 256/1024\n"
    dag = {"runs": [{"check_prefixes": ["CHECK"]}],
           "checks": [chk("Kernel Index 0/1024", directive="DAG"), chk("Kernel Index 256/1024", directive="DAG")]}
    ordered = {"runs": [{"check_prefixes": ["CHECK"]}], "checks": [chk("Kernel Index 0/1024")]}
    assert run.first_difference(run.comparable(lines, dag), run.comparable(swapped, dag)) is None
    assert run.first_difference(run.comparable(lines, dag), run.comparable("Kernel Index 0/1024\n", dag))
    assert run.first_difference(run.comparable(lines, ordered), run.comparable(swapped, ordered))


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
  # under the tool, run.py must give all of these (the default mode leaves the compilation mode unset)
  [ "$PROTEUS_ASYNC_COMPILATION" = 0 ] || [ "${PROTEUS_ASYNC_COMPILATION-unset}" = unset ] || exit 5
  [ -n "$PROTEUS_CACHE_DIR" ] && [ -n "$PROTEUS_REPORT" ] || exit 5
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


NAMES = ("good", "diff", "crash", "hang", "nocheck", "norewrite", "warmdiff")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("upstream")
    for recipe in ("plain", "recommended"):
        for name in NAMES:
            executable(tmp / "work" / "build" / recipe / name, FAKE_PROGRAM)
    tool = executable(tmp / "fake-rewrite", FAKE_TOOL)
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
    assert set(good["runs"]) == {"native-plain", "native-recommended", "rewrite", "cold", "default", "warm"}
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
    default = good["runs"]["default"]  # the defaults, on an empty cache of their own
    assert default["verdict"] == "ok" and "PROTEUS_ASYNC_COMPILATION" not in default["env"]
    assert default["env"]["PROTEUS_CACHE_DIR"] != good["runs"]["cold"]["env"]["PROTEUS_CACHE_DIR"]
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
