"""bench/corpora/upstream_tests' build.py and upstream.py: the reading of upstream's CMakeLists and lit
files, programs.json (well-formed; its sources exist upstream when the mirror is here) and
--pack. No GPU, no clang."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .tarball import run_module, unpack
from .upstream_support import build, upstream

RUN = "bench.corpora.upstream_tests.run"


# --- upstream.py: upstream's CMakeLists and lit files ----------------------------------------

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
    targets = {t["name"]: t for t in upstream.cuda_targets(files.__getitem__, 19)}
    assert list(targets) == ["kernel", "multi", "alias_func", "calls.rdc", "s"]
    assert targets["multi"]["sources"] == ["file1.cpp", "file2.cpp"]
    assert targets["calls.rdc"]["rdc"] and targets["calls.rdc"]["libraries"] == [
        {"name": "device_func_lib", "sources": ["device_func.cpp"]}]
    assert targets["s"]["sources"] == ["sub/main.cpp"] and not targets["s"]["rdc"]
    assert targets["s"]["libraries"][0]["sources"] == ["sub/a.cpp", "sub/b.cpp"]
    assert "alias_func" not in {t["name"] for t in upstream.cuda_targets(files.__getitem__, 22)}


def test_cmake_condition_refuses_what_it_does_not_know():
    assert upstream.cmake_condition(["NOT", "PROTEUS_ENABLE_HIP"], {"PROTEUS_ENABLE_HIP": False})
    with pytest.raises(ValueError):
        upstream.cmake_condition(["SOMETHING_NEW"], {})


LIT = """// RUN: rm -rf "%t.$$.proteus"
// RUN: PROTEUS_CACHE_DIR="%t.$$.proteus" PROTEUS_TRACE_OUTPUT="specialization;cache-stats" %build/prog.%ext | %FILECHECK %s --check-prefixes=CHECK-FIRST
// RUN: PROTEUS_CACHE_DIR="%t.$$.proteus" %build/prog.%ext 2>&1 | %FILECHECK %s --check-prefixes=CHECK,CHECK-%device_lang
// RUN: %build/other.%ext | %FILECHECK %s
// NOTE: not a check
// CHECK-FIRST-NEXT: [ObjectCacheChain] Chain
// CHECK-COUNT-3: Kernel
// CHECK-CUDA: cuda only
// CHECK-HIP: hip only
"""  # noqa: E501  (upstream's lit lines, as long as upstream writes them)


def test_lit_run_and_check_lines():
    runs = upstream.parse_runs(LIT, "prog")
    assert [(r["fresh_cache"], r["check_prefixes"], r["stderr_too"]) for r in runs] == [
        (True, ["CHECK-FIRST"], False), (False, ["CHECK", "CHECK-CUDA"], True)]
    assert runs[0]["env"] == {"PROTEUS_CACHE_DIR": "%t.$$.proteus", "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}
    checks = upstream.parse_checks(LIT, {"CHECK", "CHECK-FIRST", "CHECK-CUDA"})
    assert [(c["prefix"], c["directive"], c["count"], c["pattern"]) for c in checks] == [
        ("CHECK-FIRST", "NEXT", 1, "[ObjectCacheChain] Chain"), ("CHECK", "COUNT", 3, "Kernel"),
        ("CHECK-CUDA", "CHECK", 1, "cuda only")]


# --- programs.json -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc() -> dict:
    return upstream.load_programs()


def test_programs_json_is_well_formed(doc):
    assert upstream.validate(doc) == []
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
    problems = upstream.validate(bad)
    assert any("listed twice" in p for p in problems)
    assert any(p.startswith("x: no RUN line") for p in problems)
    assert any(p.startswith("x: mask") for p in problems)
    assert any(p.startswith("y: excluded") for p in problems)


def test_programs_json_sources_exist_upstream(doc):
    mirror = Path(os.environ.get("PROTEUS_UPSTREAM_MIRROR", upstream.DEFAULT_MIRROR))
    if not mirror.is_dir():
        pytest.skip(f"no mirror of upstream Proteus at {mirror}")
    commit = doc["upstream"]["commit"]
    listing = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "-r", "--name-only", commit, upstream.TESTS_DIR],
                             capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"the mirror lacks commit {commit}")
    files = set(listing.stdout.split())
    for p in doc["programs"]:
        if p["excluded"]:
            continue
        assert p["source"] in files, p["name"]
        sources = p["sources"] + [s for lib in p["libraries"] for s in lib["sources"]]
        missing = [s for s in sources if f"{upstream.TESTS_DIR}/{s}" not in files]
        assert not missing, (p["name"], missing)


def test_the_tarball_runs_with_the_standard_library_alone(tmp_path):
    """build.py --pack: run.py, checks.py and bench/lib/harness.py in the repository's layout;
    `python3 -m bench.corpora.upstream_tests.run` from the unpacked tarball's top starts with no
    site-packages and without this repository on the path, and finds its programs.json and
    work/ beside itself."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "manifest.json").write_text(json.dumps({"programs": {}}))
    out = tmp_path / "u.tar.xz"
    with pytest.raises(SystemExit, match="tuned_config.json"):  # a RUN line reads it through %S
        build.pack(out, work)
    (work / "src" / "tests" / "gpu").mkdir(parents=True)
    (work / "src" / "tests" / "gpu" / "tuned_config.json").write_text("{}\n")
    build.pack(out, work)
    names, top = unpack(out, tmp_path / "unpacked")
    corpus_dir = "bench/corpora/upstream_tests"
    assert {"bench/__init__.py", "bench/lib/__init__.py", "bench/lib/harness.py", "bench/corpora/__init__.py",
            f"{corpus_dir}/__init__.py", f"{corpus_dir}/run.py", f"{corpus_dir}/checks.py", f"{corpus_dir}/programs.json",
            f"{corpus_dir}/work/src/tests/gpu/tuned_config.json"} <= names
    assert not any(n.endswith(("build.py", "upstream.py", "builds.py")) for n in names), names
    help_ = run_module(top, RUN, "--help")
    assert help_.returncode == 0, help_.stderr
    # nothing built: every program is "not-built", and the report says so (no GPU, no tool run)
    proc = run_module(top, RUN, "--only", "kernel", "--tool", "/nonexistent/proteus-rewrite", "--out", str(tmp_path / "out"),
                      env={"PROTEUS_COMMIT": "abc123"})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "out" / "upstream-tests.json").is_file(), proc.stderr


def test_pack_lists_the_files_run_lines_read(doc):
    assert "tests/gpu/tuned_config.json" in build.run_line_files(doc)
