"""bench/corpora/cuda_samples: nvcc-built NVIDIA samples run natively and under the tool. CPU
checks only: the sample table, reading a CMakeLists.txt, masking, and run.py end to end with a
shell script in place of a sample and another in place of proteus-rewrite. No GPU, no nvcc."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bench.corpora.cuda_samples import build, run

from .tarball import run_module, unpack

# Prints its own path (as the samples print argv[0]), a line that changes on every run (a
# timing), and a result that FAKE_DIFF changes under the tool; writes the shim's report and a
# CUPTI trace where asked, its kernels named as variants under the tool.
FAKE_APP = r"""#!/bin/sh
echo "[$0] - Starting..."
echo "GPU time: $$.$$ ms"
if [ -n "$PROTEUS_CACHE_DIR" ] && [ -n "$FAKE_DIFF" ]; then echo "L1 norm: 1.5E-07"; else echo "L1 norm: 1.2E-07"; fi
if [ -n "$PROTEUS_REPORT" ]; then
  echo '{"kernels": [{"name": "k", "launches": 3, "specialized_launches": 2}]}' > "$PROTEUS_REPORT"
fi
if [ -n "$CUPTI_KERNEL_TRACE_FILE" ]; then
  if [ -n "$PROTEUS_CACHE_DIR" ]; then printf 'k\nk$proteus$ab\nk$proteus$ab\n'; else printf 'k\nk\nk\n'; fi > "$CUPTI_KERNEL_TRACE_FILE"
fi
if [ -n "$PROTEUS_CACHE_DIR" ] && [ -n "$FAKE_FAIL" ]; then echo "Test failed!"; exit 1; fi
echo "Test passed"
"""

# proteus-rewrite BIN -o DIR: the "rewritten" executable is a copy of the original.
FAKE_TOOL = r"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake-rewrite 0"; exit 0; fi
if [ -n "$FAKE_REWRITE_FAIL" ]; then echo "error: none of its kernels carries LLVM bitcode" >&2; exit 6; fi
mkdir -p "$3" && cp "$1" "$3/$(basename "$1")" && : > "$3/libproteus.so"
"""


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> dict:
    work = tmp_path / "work"
    script(work / "bin" / "fake" / "fake", FAKE_APP)
    table = tmp_path / "samples.json"
    table.write_text(json.dumps({"samples": [
        {"name": "fake", "path": "Samples/x/fake", "args": ["-n=4"], "pass": "^Test passed$", "mask": ["^GPU time: "]}]}))
    return {"work": work, "samples": table, "tool": script(tmp_path / "fake-rewrite", FAKE_TOOL),
            "out": tmp_path / "out", "tmp": tmp_path}


def main(corpus: dict, *extra: str) -> int:
    return run.main(["--work", str(corpus["work"]), "--samples", str(corpus["samples"]), "--tool", str(corpus["tool"]),
                     "--out", str(corpus["out"]), "--nvidia-smi", "true", *extra])


def results(corpus: dict) -> dict:
    return json.loads((corpus["out"] / "results.json").read_text())["samples"][0]


@pytest.fixture(autouse=True)
def _no_fake_switches(monkeypatch):
    for name in ("FAKE_DIFF", "FAKE_FAIL", "FAKE_REWRITE_FAIL", "CUPTI_INJECTION"):
        monkeypatch.delenv(name, raising=False)


def test_the_sample_table_is_well_formed():
    samples = build.load_samples()
    assert 6 <= len(samples) <= 10
    assert len({s["name"] for s in samples}) == len(samples)
    for s in samples:
        assert s["path"].startswith("Samples/") and s["path"].endswith("/" + s["name"])
        assert isinstance(s["args"], list) and s["pass"]
        for pattern in [s["pass"], *s["mask"]]:
            __import__("re").compile(pattern)


def test_cmake_target_reads_sources_separable_compilation_and_libraries():
    cmake = """
add_executable(scan main.cpp scan_gold.cpp scan.cu)
target_compile_options(scan PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda>)
set_target_properties(scan PROPERTIES CUDA_SEPARABLE_COMPILATION ON)
target_link_libraries(scan PRIVATE CUDA::cublas CUDA::cudart_static)
"""
    target = build.cmake_target(cmake, "scan")
    assert target == {"sources": ["main.cpp", "scan_gold.cpp", "scan.cu"], "libs": ["-lcublas", "-lcudart"],
                      "rdc": True, "extended_lambda": True}
    cmd = build.nvcc_command({"path": "Samples/2/scan"}, target, Path("/src"), Path("/out/scan"))
    assert "-arch=sm_90" in cmd and "-rdc=true" in cmd and "-I/src/Common" in cmd
    assert cmd[cmd.index("-o") + 1] == "/out/scan"
    with pytest.raises(ValueError):
        build.cmake_target(cmake, "other")


def test_mask_replaces_timing_lines_and_the_executable_path():
    out = "[/a/b/app] - Starting...\nGPU time: 1.5 ms\nresult 3\n"
    assert run.mask(out, ["^GPU time: "], "/a/b/app") == ["[<exe>] - Starting...", run.MASKED, "result 3"]


def test_same_output_passes_and_counts_launches(corpus, monkeypatch):
    monkeypatch.setenv("CUPTI_INJECTION", str(corpus["tmp"] / "libkernel_trace.so"))  # the fake app writes the trace
    assert main(corpus) == 0
    r = results(corpus)
    assert r["ok"] and r["native"]["verdict"] == "PASS"
    assert r["native"]["kernels_run"] == {"launches": 3, "variants": 0}
    for mode in run.MODES:
        m = r["modes"][mode]
        assert (m["verdict"], m["output"]) == ("PASS", "same"), m
        assert m["kernels_run"] == {"launches": 3, "variants": 2}
        assert m["report"]["specialized_launches"] == 2 and m["report"]["launches"] == 3
    assert "PROTEUS_ASYNC_COMPILATION" in r["modes"]["sync-cold"]["env"]
    assert r["modes"]["default-cold"]["env"]["PROTEUS_CACHE_DIR"] == r["modes"]["default-warm"]["env"]["PROTEUS_CACHE_DIR"]
    assert r["modes"]["sync-cold"]["env"]["PROTEUS_CACHE_DIR"] != r["modes"]["default-cold"]["env"]["PROTEUS_CACHE_DIR"]
    md = (corpus["out"] / "results.md").read_text()
    assert "| fake | -n=4 | PASS | PASS | PASS | PASS | 3/0 | 3/2 | 3/2 | 3/2 | 2/3 | 2/3 | 2/3 |" in md


def test_a_differing_output_fails_the_run(corpus, monkeypatch):
    monkeypatch.setenv("FAKE_DIFF", "1")
    assert main(corpus) == 1
    r = results(corpus)
    assert not r["ok"]
    for mode in run.MODES:
        m = r["modes"][mode]
        assert m["verdict"] == "PASS" and m["output"] == "DIFF"  # the sample's own check still passes
        assert any("L1 norm" in d for d in m["diff"])
    assert "PASS, output DIFF" in (corpus["out"] / "results.md").read_text()


def test_without_the_mask_the_timing_line_differs(corpus):
    doc = json.loads(corpus["samples"].read_text())
    doc["samples"][0]["mask"] = []
    corpus["samples"].write_text(json.dumps(doc))
    assert main(corpus) == 1
    assert any("GPU time" in d for d in results(corpus)["modes"]["sync-cold"]["diff"])


def test_a_failing_tool_run_is_reported(corpus, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert main(corpus) == 1
    m = results(corpus)["modes"]["default-warm"]
    assert m["verdict"] == "FAIL (rc 1)" and m["output"] == "DIFF" and m["diff"][0].startswith("exit code")


def test_a_failed_rewrite_is_reported(corpus, monkeypatch):
    monkeypatch.setenv("FAKE_REWRITE_FAIL", "1")
    assert main(corpus) == 1
    r = results(corpus)
    assert r["modes"] == {} and r["rewrite"]["rc"] == 6
    md = (corpus["out"] / "results.md").read_text()
    assert "REWRITE-FAILED" in md and "carries LLVM bitcode" in md


def test_dry_run_prints_the_commands_and_runs_nothing(corpus, capsys):
    assert main(corpus, "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 1 + len(run.MODES)
    assert lines[0].endswith("/bin/fake/fake -n=4)")
    assert " -o " in lines[1] and "PROTEUS_ASYNC_COMPILATION=0" in lines[2]
    assert all("PROTEUS_REPORT=" in line for line in lines[2:])
    assert not corpus["out"].exists()


def test_unknown_sample_is_refused(corpus):
    with pytest.raises(SystemExit):
        main(corpus, "--only", "nope")


def test_the_tarball_runs_with_the_standard_library_alone(corpus):
    """build.py --pack: run.py, samples.json and bench/lib/harness.py in the repository's layout;
    `python3 -m bench.corpora.cuda_samples.run` from the unpacked tarball's top runs its builds
    (work/ beside run.py) end to end, with no site-packages and without this repository on the path."""
    tmp, work = corpus["tmp"], corpus["work"]
    samples = json.loads(corpus["samples"].read_text())["samples"]
    (work / "manifest.json").write_text(json.dumps({"samples": {"fake": {"status": "ok"}}}))
    out = tmp / "s.tar.xz"
    build.pack(out, work, samples)
    names, top = unpack(out, tmp / "unpacked")
    corpus_dir = "bench/corpora/cuda_samples"
    assert {"bench/__init__.py", "bench/lib/__init__.py", "bench/lib/harness.py", "bench/corpora/__init__.py",
            f"{corpus_dir}/__init__.py", f"{corpus_dir}/run.py", f"{corpus_dir}/samples.json",
            f"{corpus_dir}/work/manifest.json", f"{corpus_dir}/work/bin/fake/fake"} <= names
    assert not any(n.endswith(("build.py", "builds.py")) for n in names), names
    (top / corpus_dir / "samples.json").write_text(corpus["samples"].read_text())  # the fake sample's table
    proc = run_module(top, "bench.corpora.cuda_samples.run", "--tool", str(corpus["tool"]), "--nvidia-smi", "true",
                      "--out", str(tmp / "out"))
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads((tmp / "out" / "results.json").read_text())["samples"]
    assert r["ok"] and all(r["modes"][m]["verdict"] == "PASS" for m in run.MODES), r
