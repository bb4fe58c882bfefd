"""bench/corpora/hecbench: the HeCBench differential-testing corpus. Fast CPU checks only: the program
list is well-formed and stays on names a..m, output masking, the comparison, the share of
launches a report says were specialized, and run.py end to end against a fake GPU (a shell
script in place of the programs and of proteus-rewrite). No GPU, no clang, no network."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.corpora.hecbench import build, corpus
from bench.lib import harness
from bench.lib.paths import ROOT

from .tarball import run_module, unpack

RUN = "bench.corpora.hecbench.run"
PAPER = {"adam", "wsm5", "rsbench", "feynman-kac", "lulesh", "sw4ck"}


@pytest.fixture(scope="module")
def doc() -> dict:
    return corpus.load_programs()


def test_programs_json_is_well_formed(doc):
    assert corpus.validate(doc) == []
    assert len(doc["hecbench"]["commit"]) == 40


def test_the_paper_suite_is_the_six_programs_of_the_paper(doc):
    assert {p["name"] for p in doc["programs"] if p["suite"] == "paper"} == PAPER


def test_the_corpus_draws_on_names_a_to_m_only_and_leaves_the_paper_programs_out(doc):
    names = [p["name"] for p in doc["programs"] if p["suite"] == "corpus"]
    assert len(names) >= 45
    assert all("a" <= n[0].lower() <= "m" for n in names), [n for n in names if not "a" <= n[0].lower() <= "m"]
    assert not set(names) & PAPER


def test_the_corpus_covers_what_the_tool_must_handle(doc):
    tags = {t for p in doc["programs"] if p["suite"] == "corpus" for t in p["tags"]}
    assert {"shuffle", "atomics", "shared", "templates", "device-globals", "float", "double"} <= tags


def test_a_broken_entry_is_named(doc):
    bad = {"programs": [{**doc["programs"][0]}, {**doc["programs"][-1], "name": "zeta", "folder": "src/zeta-cuda",
                                                 "suite": "corpus", "mask": ["("]}]}
    bad["programs"].append(bad["programs"][0])
    problems = corpus.validate(bad)
    assert any("listed twice" in p for p in problems)
    assert any("zeta: corpus programs start with a..m" in p for p in problems)
    assert any("zeta: mask '('" in p for p in problems)


def test_masking_hides_timings_and_addresses_but_not_results(doc):
    patterns = corpus.mask_patterns(doc, {"mask": [r"^Device:"]})
    text = ("Average kernel execution time: 12.5 (us)\nchecksum = 42.000000\nPASS  \n"
            "Total time 3.2 ms\nthroughput 812.3 GB/s\nbuffer at 0x7f3a2c000000\nDevice: H100\n")
    assert corpus.mask_lines(text, patterns) == [corpus.MASKED, "checksum = 42.000000", "PASS", corpus.MASKED,
                                                 corpus.MASKED, corpus.MASKED, corpus.MASKED]


def test_comparison_tells_same_close_differs_and_unstable():
    assert corpus.compare(["a 1", "PASS"], ["a 1", "PASS"]).verdict == "same"
    close = corpus.compare(["sum 1.0000001"], ["sum 1.0000002"], rtol=1e-6)
    assert close.verdict == "close" and 0 < close.max_rel < 1e-6
    differs = corpus.compare(["sum 1.0", "PASS"], ["sum 1.5", "FAIL"], rtol=1e-6)
    assert differs.verdict == "differs" and differs.diff[:2] == ["1-'sum 1.0'", "1+'sum 1.5'"]
    assert corpus.compare(["x"], ["x", "extra"]).verdict == "differs"
    first, second = ["seed 1", "PASS"], ["seed 2", "PASS"]
    unstable = corpus.unstable_lines(first, second)
    assert unstable == {0}
    assert corpus.compare(first, ["seed 3", "PASS"], unstable=unstable, native_unstable=True).verdict == "same"
    assert corpus.compare(first, ["seed 3", "FAIL"], unstable=unstable, native_unstable=True).verdict == "unstable"


def test_report_share_sums_over_kernels():
    report = {"unknown_handle_launches": 0, "kernels": [
        {"name": "k1", "launches": 10, "specialized_launches": 9, "fallback_launches": 1,
         "failures": {"compile error": 1}},
        {"name": "k2", "launches": 30, "specialized_launches": 21, "fallback_launches": 9,
         "failures": {"compile error": 2, "budget": 1}},
        {"name": "unregistered", "launches": 0, "fallback_launches": 0, "specialized_launches": 0, "failures": {}}]}
    share = harness.report_share(report)
    assert (share["launches"], share["specialized_launches"], share["fallback_launches"]) == (40, 30, 10)
    assert share["share"] == 0.75 and share["failures"] == {"compile error": 3, "budget": 1}
    assert harness.report_share({"kernels": []})["share"] is None


FAKE_APP = """#!/bin/sh
# a fake GPU program: the same output every run but for its timing line
echo "args: $*"
echo "Average kernel execution time: $$ (us)"
echo "checksum 3.25"
echo PASS
if [ -n "$PROTEUS_REPORT" ] && [ "$PROTEUS_VALIDATE" != "0" ]; then   # checked: the default, or every variant
  echo '{"kernels": [{"name": "k", "launches": 4, "specialized_launches": 3, "fallback_launches": 1, "failures": {}}],
         "validation": [{"kernel": "k(int)", "verdict": "same", "ms": 2.5},
                        {"kernel": "g(int)", "verdict": "differs", "ms": 1.0}],
         "shim_wait_ms": {"checks": {"ms": 6.0, "count": 2, "phases": {"prepare": 1.0, "shadow": 2.0, "app": 0.5,
                                     "compare": 0.0, "readback": 1.5, "python": 1.0, "free": 0.0}}}}' > "$PROTEUS_REPORT"
elif [ -n "$PROTEUS_REPORT" ]; then
  echo '{"kernels": [{"name": "k", "launches": 4, "specialized_launches": 3, "fallback_launches": 1, "failures": {}}]}' > "$PROTEUS_REPORT"
fi
"""
FAKE_TOOL = """#!/bin/sh
# a fake proteus-rewrite: APP -o DIR
[ "$1" = "--version" ] && { echo "fake-rewrite 0"; exit 0; }
touch "$3/libproteus.so"
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_run_py_end_to_end_against_a_fake_gpu(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = tmp_path / "work"
    manifest = {"hecbench_commit": doc["hecbench"]["commit"], "programs": {name: {}}}
    for recipe in ("plain", "recommended", "fembed-bitcode"):
        (work / "build" / recipe / name).mkdir(parents=True)
        (work / "build" / recipe / name / "main").write_text("not run: --exe stands in\n")
        manifest["programs"][name][recipe] = {"status": "ok"}
    (work / "manifest.json").write_text(json.dumps(manifest))
    app, tool = _script(tmp_path / "app.sh", FAKE_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    smi = _script(tmp_path / "smi.sh", "#!/bin/sh\necho 'Fake GPU, 1.0'\n")
    out = tmp_path / "out"
    env = {**os.environ, "PROTEUS_COMMIT": "abc123"}
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out),
                           "--only", name, "--exe", str(app), "--tool", str(tool), "--nvidia-smi", str(smi)],
                          capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "hecbench-corpus.json").read_text())
    assert result["gpu"] == "Fake GPU, 1.0" and result["command"].endswith(f"--nvidia-smi {smi}")
    (prog,) = result["programs"]
    for recipe in ("recommended", "fembed-bitcode"):
        for mode in ("sync-cold", "default-cold", "default-warm"):
            v = prog["verdicts"][recipe][mode]
            assert v["verdict"] == "ok", v
            assert v["report"]["share"] == 0.75
    sync = prog["tool"]["recommended"]["sync-cold"]
    assert sync["env"]["PROTEUS_ASYNC_COMPILATION"] == "0" and sync["env"]["LD_PRELOAD"].endswith("libproteus.so")
    assert "PROTEUS_ASYNC_COMPILATION" not in prog["tool"]["recommended"]["default-warm"]["env"]
    table = (out / "hecbench-corpus.md").read_text()
    assert f"| {name} |" in table and "3/4 (75%)" in table and "ok / ok / ok" in table


def _one_build(tmp_path: Path, name: str) -> Path:
    """A work folder with one program's recommended build (the binary itself never runs)."""
    work = tmp_path / "work"
    (work / "build" / "recommended" / name).mkdir(parents=True)
    (work / "build" / "recommended" / name / "main").write_text("not run\n")
    (work / "manifest.json").write_text(json.dumps({"programs": {name: {"recommended": {"status": "ok"}}}}))
    return work


def test_run_py_validate_mode_counts_what_validation_found(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    app, tool = _script(tmp_path / "app.sh", FAKE_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--exe", str(app), "--tool", str(tool), "--nvidia-smi", "/nonexistent", "--modes", "sync-cold",
                           "--validate"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    assert set(prog["verdicts"]["recommended"]) == {"sync-cold", "validate"}
    v = prog["verdicts"]["recommended"]["validate"]
    assert v["verdict"] == "ok" and v["validation"]["same"] == 1 and v["validation"]["differs"] == 1
    assert v["validation"]["differing_kernels"] == ["g(int)"] and v["validation"]["check_ms"] == 3.5
    env = prog["tool"]["recommended"]["validate"]["env"]
    assert env["PROTEUS_VALIDATE"] == "1" and env["PROTEUS_ASYNC_COMPILATION"] == "0"
    md = (out / "hecbench-corpus.md").read_text()
    assert "## Under validation" in md and f"| {name} | recommended | ok | 1 | 1 | 0 | 3.5 |" in md


def test_run_py_check_cost_runs_cold_without_the_check_and_tables_what_it_found(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    app, tool = _script(tmp_path / "app.sh", FAKE_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--exe", str(app), "--tool", str(tool), "--nvidia-smi", "/nonexistent",
                           "--modes", "default-cold", "--check-cost"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    assert set(prog["verdicts"]["recommended"]) == {"default-cold", "nocheck-cold"}
    env = prog["tool"]["recommended"]["nocheck-cold"]["env"]
    assert env["PROTEUS_VALIDATE"] == "0" and env["PROTEUS_CACHE_DIR"].endswith("cache-nocheck")
    assert "PROTEUS_VALIDATE" not in prog["tool"]["recommended"]["default-cold"]["env"]
    md = (out / "hecbench-corpus.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith(f"| {name} | recommended | 1 | g(int) |"))
    assert row.rstrip(" |").split("|")[-1].count(" / ") == 1, row  # the checked cold run's seconds, the unchecked one's


def test_check_cost_reps_alternate_cold_runs_with_and_without_the_check(tmp_path, doc):
    """--check-cost-reps 3: three cold runs a side, each side first in turn, each from an empty
    cache of its own; the checked side's checks and their time come from its reports."""
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    log = tmp_path / "runs.log"
    app = _script(tmp_path / "app.sh", FAKE_APP.replace("#!/bin/sh\n", "#!/bin/sh\n"
                  f'echo "${{PROTEUS_VALIDATE:-check}} $PROTEUS_CACHE_DIR $(ls $PROTEUS_CACHE_DIR 2>/dev/null | wc -l)" >> {log}\n'
                  'mkdir -p "$PROTEUS_CACHE_DIR" && touch "$PROTEUS_CACHE_DIR/entry"\n', 1))
    tool = _script(tmp_path / "tool.sh", FAKE_TOOL)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--exe", str(app), "--tool", str(tool), "--nvidia-smi", "/nonexistent",
                           "--modes", "default-cold", "--check-cost-reps", "3",
                           "--check-cost-with", "PROTEUS_VALIDATE_GRACE_MS=0"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    cost = prog["cost"]["recommended"]
    assert [(r["rep"], r["side"]) for r in cost["runs"]] == [
        (0, "check"), (0, "nocheck"), (0, "check-with"), (1, "nocheck"), (1, "check-with"), (1, "check"),
        (2, "check-with"), (2, "check"), (2, "nocheck")]
    assert cost["checks"] == [2, 2, 2] and cost["check_ms"] == [3.5, 3.5, 3.5] and cost["checks_with"] == [2, 2, 2]
    assert len(cost["check_s"]) == len(cost["nocheck_s"]) == len(cost["check-with_s"]) == 3
    assert cost["ratio"] is not None and cost["ratio_with"] is not None and cost["with"] == {"PROTEUS_VALIDATE_GRACE_MS": "0"}
    runs = [r for r in (line.split() for line in log.read_text().splitlines()) if len(r) == 3 and "cache-cost" in r[1]]
    assert [r[0] for r in runs] == ["check", "0", "check", "0", "check", "check", "check", "check", "0"]
    assert {r[1].rsplit("/", 1)[-1] for r in runs} == {"cache-cost-check", "cache-cost-nocheck", "cache-cost-check-with"}
    assert all(r[2] == "0" for r in runs)  # every one of them cold
    assert cost["shim_check_ms"] == [6.0, 6.0, 6.0] and cost["phases_ms"][0]["readback"] == 1.5
    md = (out / "hecbench-corpus.md").read_text()
    assert "## The default check's cost, cold" in md and f"| {name} | recommended | " in md.split("cost, cold")[1]
    assert "| 2 | 3.5 | 6.0 | shadow 2.0, readback 1.5, python 1.0 |" in md
    assert "- with PROTEUS_VALIDATE_GRACE_MS=0: 1 programs" in md


def test_a_cost_run_that_crashes_keeps_what_it_printed_last(tmp_path, doc):
    """A checked cold run that dies is left out of the times, with its exit code and the end of
    its stderr (a heap abort's message is the evidence a crash leaves)."""
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    app = _script(tmp_path / "app.sh", FAKE_APP.replace("#!/bin/sh\n", "#!/bin/sh\n"
                  'case "$PROTEUS_CACHE_DIR" in *cache-cost-check) echo "free(): invalid pointer" >&2; exit 134;; esac\n',
                  1))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--exe", str(app), "--tool", str(_script(tmp_path / "tool.sh", FAKE_TOOL)),
                           "--nvidia-smi", "/nonexistent", "--modes", "default-cold", "--check-cost-reps", "1"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    (checked,) = [r for r in prog["cost"]["recommended"]["runs"] if r["side"] == "check"]
    assert checked["rc"] == 134 and checked["excluded"] == "output CRASH"
    assert "free(): invalid pointer" in checked["stderr_tail"]


def test_run_py_dry_run_prints_the_commands_and_runs_nothing(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "paper")
    work = _one_build(tmp_path, name)
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(tmp_path / "o"),
                           "--only", name, "--dry-run", "--tool", "proteus-rewrite", "--nvidia-smi", "/nonexistent"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum("PROTEUS_ASYNC_COMPILATION=0" in l for l in lines) == 1
    assert sum("LD_PRELOAD=" in l for l in lines) == 3 and any("proteus-rewrite" in l and " -o " in l for l in lines)
    assert not (tmp_path / "o").exists()


def test_the_tarball_runs_with_the_standard_library_alone(tmp_path, doc):
    """build.py --pack: run.py, corpus.py and bench/lib/harness.py in the repository's layout;
    `python3 -m bench.corpora.hecbench.run` from the unpacked tarball's top runs its builds
    (work/ beside run.py) end to end against a fake GPU, with no site-packages and without
    this repository on the path."""
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = tmp_path / "work"
    manifest = {"hecbench_commit": doc["hecbench"]["commit"], "programs": {name: {}}}
    for recipe in ("plain", "recommended"):
        (work / "build" / recipe / name).mkdir(parents=True)
        (work / "build" / recipe / name / "main").write_text("not run: --exe stands in\n")
        (work / "build" / recipe / name / "input.dat").write_text("an input the program reads\n")
        manifest["programs"][name][recipe] = {"status": "ok"}
    (work / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "h.tar.xz"
    build.pack(out, work, [p for p in doc["programs"] if p["name"] == name], ["plain", "recommended"])
    names, top = unpack(out, tmp_path / "unpacked")
    corpus_dir = "bench/corpora/hecbench"
    assert {"bench/__init__.py", "bench/lib/__init__.py", "bench/lib/harness.py", "bench/corpora/__init__.py",
            f"{corpus_dir}/__init__.py", f"{corpus_dir}/run.py", f"{corpus_dir}/corpus.py", f"{corpus_dir}/programs.json",
            f"{corpus_dir}/work/manifest.json", f"{corpus_dir}/work/build/recommended/{name}/input.dat"} <= names
    assert not any(n.endswith(("build.py", "paths.py", "builds.py")) for n in names), names
    help_ = run_module(top, RUN, "--help")
    assert help_.returncode == 0 and "--validate" in help_.stdout and "--speed-reps" in help_.stdout, help_.stderr
    app, tool = _script(tmp_path / "app.sh", FAKE_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    proc = run_module(top, RUN, "--only", name, "--recipes", "plain,recommended", "--exe", str(app), "--tool", str(tool),
                      "--nvidia-smi", "/nonexistent", "--modes", "sync-cold", "--out", str(tmp_path / "out"),
                      env={"PROTEUS_COMMIT": "abc123"})
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((tmp_path / "out" / "hecbench-corpus.json").read_text())["programs"]
    assert prog["verdicts"]["recommended"]["sync-cold"]["verdict"] == "ok", prog["verdicts"]
    assert prog["tool"]["recommended"]["sync-cold"]["cwd"].startswith(str(top / corpus_dir / "work" / "build"))


# --- the nvcc recipe ------------------------------------------------------------------------

BASE_NVCC = ["-std=c++17", "-Xcompiler", "-Wall", "-arch=sm_90", "-O3"]


def test_every_program_has_its_makefiles_nvcc_flags_with_sm_90(doc):
    assert "nvcc" in corpus.RECIPES and "nvcc" in corpus.program_recipes(doc["programs"][0])
    for p in doc["programs"]:
        assert "-arch=sm_90" in p["nvcc_flags"], p["name"]  # SASS and compute_90 PTX
        assert p["nvcc_flags"][0] in ("-std=c++17", "-DMKX=4"), p["name"]
    by_name = {p["name"]: p for p in doc["programs"]}
    assert by_name["wsm5"]["nvcc_flags"] == ["-DMKX=4", *BASE_NVCC]
    assert by_name["rsbench"]["nvcc_libs"] == ["-lm"]
    assert "--use_fast_math" in by_name["cooling"]["nvcc_flags"] and "-DVERIFY" in by_name["fluidSim"]["nvcc_flags"]


def test_nvcc_only_programs_are_built_by_nvcc_alone_and_no_longer_excluded(doc):
    only = {p["name"]: p for p in doc["programs"] if p.get("recipes") == ["nvcc"]}
    assert {"atomicCAS", "fresnel", "gpp", "michalewicz"} <= set(only)
    assert not set(only) & set(doc["excluded"])
    for p in only.values():
        assert corpus.program_recipes(p) == ("nvcc",) and p["suite"] == "corpus"
        assert "nvcc only" in p["note"]
    assert only["fresnel"]["nvcc_rdc"] is True and "rdc" in only["fresnel"]["tags"]
    assert "interval" in doc["excluded"]  # needs a system Boost, with nvcc too


def test_validate_names_broken_nvcc_fields(doc):
    good = next(p for p in doc["programs"] if p["name"] == "adam")
    bad = {"programs": [{**good, "name": "a1", "folder": "src/a1-cuda", "nvcc_flags": ["-O3"]},
                        {**good, "name": "a2", "folder": "src/a2-cuda", "nvcc_rdc": True},
                        {**{k: v for k, v in good.items() if k != "nvcc_flags"}, "name": "a3", "folder": "src/a3-cuda",
                         "recipes": ["nvcc"]},
                        {**good, "name": "a4", "folder": "src/a4-cuda", "recipes": ["gcc"]}]}
    problems = corpus.validate(bad)
    assert any("a1: nvcc_flags lack -arch=sm_90" in p for p in problems)
    assert any("a2: nvcc_rdc programs are tagged rdc" in p for p in problems)
    assert any("a3: recipes name nvcc but nvcc_flags is missing" in p for p in problems)
    assert any("a4: recipes" in p for p in problems)
    # no nvcc_flags: not built by nvcc
    assert "nvcc" not in corpus.program_recipes({k: v for k, v in good.items() if k != "nvcc_flags"})


NVCC_ENV = SimpleNamespace(nvcc="/cuda/bin/nvcc")  # what nvcc_commands takes of a BuildEnv


def test_nvcc_commands_compile_each_file_apart_and_link_as_the_makefile(tmp_path, doc):
    by_name = {p["name"]: p for p in doc["programs"]}
    src, exe = tmp_path / "src", tmp_path / "out" / ".main.tmp"
    cmds = build.nvcc_commands(by_name["rsbench"], src, exe, NVCC_ENV)
    assert len(cmds) == 7 and all(c[0] == "/cuda/bin/nvcc" for c in cmds)
    assert cmds[0] == ["/cuda/bin/nvcc", *BASE_NVCC, "-c", str(src / "main.cu"), "-o", str(exe.parent / ".objs" / "main.cu.o")]
    assert cmds[-1][-3:] == ["-o", str(exe), "-lm"] and cmds[-1][1:6] == BASE_NVCC
    fresnel = build.nvcc_commands(by_name["fresnel"], src, exe, NVCC_ENV)
    assert all("-dc" in c and "-c" not in c for c in fresnel[:-1]) and "-dc" not in fresnel[-1]
    lebesgue = build.nvcc_commands(by_name["lebesgue"], src, exe, NVCC_ENV)
    assert [c[c.index("-o") - 1] for c in lebesgue[:-1]] == [str(src / f) for f in ("kernels.cu", "main.cpp", "utils.cpp")]


MAKEFILE = """CC = nvcc
ARCH = sm_60
VERIFY = yes
program = main
source = main.cu kernels.cu
obj = $(source:.cu=.o)
CFLAGS := $(EXTRA_CFLAGS) -std=c++17 -Xcompiler -Wall -arch=$(ARCH)
ifeq ($(VERIFY),yes)
  CFLAGS += -DVERIFY
endif
CFLAGS += -O3 -use_fast_math
$(program): $(obj)
\t$(CC) $(CFLAGS) $(obj) -o $@ -lm
%.o: %.cu
\t$(CC) $(CFLAGS) -dc $< -o $@
"""


@pytest.mark.skipif(not shutil.which("make"), reason="no make")
def test_the_nvcc_fields_derive_from_the_makefile(tmp_path, doc):
    for name in ("Makefile", "main.cu", "kernels.cu"):
        (tmp_path / name).write_text(MAKEFILE if name == "Makefile" else "")
    derived = build.makefile_nvcc(tmp_path)
    assert derived == {"nvcc_flags": [*BASE_NVCC[:4], "-DVERIFY", "-O3", "-use_fast_math"], "nvcc_libs": ["-lm"],
                       "nvcc_rdc": True, "files": ["main.cu", "kernels.cu"]}
    program = {"name": "x", "sources": ["main.cu", "kernels.cu"], **{k: derived[k] for k in ("nvcc_flags", "nvcc_libs")},
               "nvcc_rdc": True}
    assert build.nvcc_mismatches(program, derived) == []
    stale = build.nvcc_mismatches({**program, "nvcc_flags": BASE_NVCC, "sources": ["main.cu"]}, derived)
    assert len(stale) == 2 and "nvcc_flags" in stale[0] and "the Makefile compiles" in stale[1]


def test_run_py_runs_an_nvcc_build_twice_natively_and_under_the_tool(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p.get("recipes") == ["nvcc"])
    work = tmp_path / "work"
    (work / "build" / "nvcc" / name).mkdir(parents=True)
    (work / "build" / "nvcc" / name / "main").write_text("not run\n")
    (work / "manifest.json").write_text(json.dumps({"programs": {name: {"nvcc": {"status": "ok"}}}}))
    app, tool = _script(tmp_path / "app.sh", FAKE_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--recipes", "nvcc", "--exe", str(app), "--tool", str(tool), "--nvidia-smi", "/nonexistent"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    assert set(prog["native"]) == {"nvcc", "nvcc-again"} and set(prog["verdicts"]) == {"nvcc"}
    assert all(prog["verdicts"]["nvcc"][m]["verdict"] == "ok" for m in ("sync-cold", "default-cold", "default-warm"))
    table = (out / "hecbench-corpus.md").read_text()
    assert "| nvcc |" in table and "ok / ok / ok | 3/4 (75%) |" in table


def test_pack_with_recipes_carries_those_builds_only(tmp_path, doc):
    names = [doc["programs"][0]["name"], next(p["name"] for p in doc["programs"] if p.get("recipes") == ["nvcc"])]
    work = tmp_path / "work"
    manifest = {"hecbench_commit": doc["hecbench"]["commit"], "programs": {}}
    for name in names:
        for recipe in ("recommended", "nvcc"):
            (work / "build" / recipe / name).mkdir(parents=True)
            (work / "build" / recipe / name / "main").write_text("x\n")
            (work / "build" / recipe / name / "build.log").write_text("log\n")
            manifest["programs"].setdefault(name, {})[recipe] = {"status": "ok"}
    (work / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "n.tar.xz"
    build.pack(out, work, [p for p in doc["programs"] if p["name"] in names], ["nvcc"])
    members, top = unpack(out, tmp_path / "u")
    builds = {n for n in members if "/work/build/" in n}
    assert builds == {f"bench/corpora/hecbench/work/build/nvcc/{n}/main" for n in names}
    packed = json.loads((top / "bench/corpora/hecbench/work/manifest.json").read_text())
    assert {r for p in packed["programs"].values() for r in p} == {"nvcc"}


# --- GPU kernel time (--speed-reps) ---------------------------------------------------------

FAKE_TIMED_APP = """#!/bin/sh
# a fake GPU program that writes a timed CUPTI trace (kernel_trace.c's format: NAME<tab>NS) when
# asked; its traced runs count themselves in $FAKE_STATE, per side, and take the times listed
# there; the warm side's 2nd timed run prints a wrong checksum
side=native; [ -n "$LD_PRELOAD" ] && side=warm
n=0
if [ "$CUPTI_KERNEL_TRACE_TIMES" = 1 ]; then
  n=$(cat "$FAKE_STATE/$side" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$FAKE_STATE/$side"
fi
echo "args: $*"
echo "Average kernel execution time: $$ (us)"
if [ "$side$n" = warm2 ]; then echo "checksum 9.75"; else echo "checksum 3.25"; fi
echo PASS
if [ "$CUPTI_KERNEL_TRACE_TIMES" = 1 ]; then
  case "$side$n" in
    native1) t=4000000 ;; native2) t=6000000 ;; native3) t=5000000 ;;
    warm1) t=1500000 ;; warm2) t=100 ;; warm3) t=2500000 ;;
  esac
  if [ $side = warm ]; then
    printf 'k(int)$proteus$0a1b\\t%s\\ng(float*)\\t500000\\n' $t > "$CUPTI_KERNEL_TRACE_FILE"
  else
    printf 'k(int)\\t%s\\ng(float*)\\t500000\\n' $t > "$CUPTI_KERNEL_TRACE_FILE"
  fi
elif [ -n "$CUPTI_KERNEL_TRACE_FILE" ]; then
  printf 'k(int)\\ng(float*)\\n' > "$CUPTI_KERNEL_TRACE_FILE"
fi
if [ -n "$PROTEUS_REPORT" ]; then
  echo '{"kernels": [{"name": "k", "launches": 4, "specialized_launches": 3, "fallback_launches": 1, "failures": {}}]}' > "$PROTEUS_REPORT"
fi
"""


def test_speed_reps_times_native_against_default_warm_from_cupti(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    app, tool = _script(tmp_path / "app.sh", FAKE_TIMED_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    proc = subprocess.run([sys.executable, "-m", RUN, "--work", str(work), "--out", str(out), "--only", name,
                           "--exe", str(app), "--tool", str(tool), "--nvidia-smi", "/nonexistent", "-j", "1",
                           "--kernel-trace", "/nonexistent/libkernel_trace.so", "--speed-reps", "3"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "FAKE_STATE": str(state)})
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((out / "hecbench-corpus.json").read_text())["programs"]
    assert prog["verdicts"]["recommended"]["default-warm"]["verdict"] == "ok"
    s = prog["speed"]["recommended"]
    runs = s["runs"]
    assert [(r["side"], r["rep"]) for r in runs] == [(side, i) for i in range(3) for side in ("native", "warm")]
    warm = [r for r in runs if r["side"] == "warm"]
    assert all(r["verdict"] == "ok" for r in runs if r is not warm[1])
    # the warm run whose output differs is excluded, not timed
    assert warm[1]["verdict"] == "DIFF" and warm[1]["excluded"] == "output DIFF" and "kernel_ms" not in warm[1]
    assert s["native_ms"] == [4.5, 6.5, 5.5] and s["warm_ms"] == [2.0, 3.0]
    assert (s["native_median_ms"], s["native_min_ms"], s["native_max_ms"]) == (5.5, 4.5, 6.5)
    assert (s["warm_median_ms"], s["warm_min_ms"], s["warm_max_ms"]) == (2.5, 2.0, 3.0)
    assert s["speedup"] == 2.2 and s["warm_excluded"] == 1 and s["native_excluded"] == 0
    assert s["warm_launches"] == [2, 2] and s["warm_variant_launches"] == [1, 1] and s["native_variant_launches"] == [0, 0, 0]
    # the warm runs ran as default-warm did (its cache, the default policy), with per-kernel times on
    timed = prog["tool"]["recommended"]["default-warm"]["env"]
    speed_dir = Path(timed["PROTEUS_CACHE_DIR"]).parent
    assert (speed_dir / "speed-warm-2.txt").read_text().startswith("k(int)$proteus$0a1b\t2500000\n")
    md = (out / "hecbench-corpus.md").read_text()
    assert "## GPU kernel time" in md
    # each kernel launched once: nothing left without the first launches
    assert s["steady_speedup"] is None and all(r["first_ms"] == r["kernel_ms"] for r in runs if "kernel_ms" in r)
    assert (f"| {name} | recommended | 5.500 [4.500-6.500] | 2.500 [2.000-3.000] | 2.200x | - | 1/2 | "
            "1: warm #1: output DIFF |") in md
    assert "- recommended: geomean speed-up 2.200x over 1 programs; 0 below 0.99, 1 at or above 1.10" in md


def test_the_speed_up_without_first_launches_counts_a_variant_as_its_kernel():
    from bench.corpora.hecbench import run

    us = 1000
    native = [("k(int)", 900 * us), ("k(int)", 100 * us), ("k(int)", 100 * us), ("g()", 50 * us), ("g()", 50 * us)]
    warm = [("k(int)", 950 * us), ("k(int)$proteus$ab", 60 * us), ("k(int)$proteus$ab", 60 * us), ("g()", 50 * us),
            ("g()", 50 * us)]
    assert run.first_launches_ns(native) == 950 * us and run.first_launches_ns(warm) == 1000 * us
    records = [{"side": side, "rep": 0, "kernel_ms": sum(ns for _, ns in t) / 1e6,
                "first_ms": run.first_launches_ns(t) / 1e6, "launches": 5, "variant_launches": 0}
               for side, t in (("native", native), ("warm", warm))]
    s = run.speed_summary(records, 1)
    assert s["speedup"] == round(1200 / 1170, 4)  # the first launch, slower under the tool, hides most of it
    assert s["steady_speedup"] == round(250 / 170, 4)


def test_speed_reps_needs_a_kernel_trace_and_a_matching_warm_run(tmp_path, doc):
    name = next(p["name"] for p in doc["programs"] if p["suite"] == "corpus")
    work = _one_build(tmp_path, name)
    base = [sys.executable, "-m", RUN, "--work", str(work), "--only", name, "--nvidia-smi", "/nonexistent"]
    proc = subprocess.run([*base, "--speed-reps", "2", "--dry-run"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "--kernel-trace" in proc.stderr
    # default-warm not run (--modes): nothing timed, and the results say why
    app, tool = _script(tmp_path / "app.sh", FAKE_TIMED_APP), _script(tmp_path / "tool.sh", FAKE_TOOL)
    (tmp_path / "state").mkdir()
    proc = subprocess.run([*base, "--out", str(tmp_path / "out"), "--exe", str(app), "--tool", str(tool),
                           "--modes", "sync-cold", "--kernel-trace", "/x/lib.so", "--speed-reps", "2"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "FAKE_STATE": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    (prog,) = json.loads((tmp_path / "out" / "hecbench-corpus.json").read_text())["programs"]
    assert prog["speed"]["recommended"] == {"skipped": "no default-warm run (--modes)"}
    assert "not measured: no default-warm run (--modes)" in (tmp_path / "out" / "hecbench-corpus.md").read_text()


def test_speed_summary_line_per_recipe_geomean_counts_and_worst():
    from bench.corpora.hecbench import run

    def prog(name, speedup):
        return {"name": name, "speed": {"nvcc": {"speedup": speedup}}}

    results = [prog("a", 2.0), prog("b", 0.5), prog("c", 1.0), prog("d", 1.1), prog("e", 0.98), prog("f", 1.05),
               prog("g", 3.0), {"name": "h", "speed": {"nvcc": {"skipped": "default-warm DIFF"}}}, {"name": "i"}]
    (line,) = run.speed_summary_lines(results)
    # geomean of 2, 0.5, 1, 1.1, 0.98, 1.05, 3
    assert line.startswith("- nvcc: geomean speed-up 1.191x over 7 programs; 2 below 0.99, 3 at or above 1.10; ")
    assert line.endswith("worst: b 0.500x, e 0.980x, c 1.000x, f 1.050x, d 1.100x; 1 not measured")
