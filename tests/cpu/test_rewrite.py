"""Rewritten executables, on the CPU: valid ELF, only the intended changes, the input
untouched, bad inputs refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

import lief
import pytest

from proteus_rewrite.fatbin import extract

from ..conftest import run_cli

lief.logging.disable()


def rewrite(samples, app, outdir, *extra):
    proc = run_cli(str(samples / app), "-o", str(outdir), *extra)
    assert proc.returncode == 0, proc.stderr
    return outdir / app


@pytest.mark.parametrize("app", ["loop_count", "loop_count_nopie", "loop_count_dynamic", "two_tu", "driver_api"])
def test_rewritten_executable_loads_the_shim_from_its_own_directory(samples, tmp_path, app):
    before = hashlib.sha256((samples / app).read_bytes()).hexdigest()
    exe = rewrite(samples, app, tmp_path)
    assert hashlib.sha256((samples / app).read_bytes()).hexdigest() == before  # input untouched
    b = lief.ELF.parse(str(exe))
    needed = [e.name for e in b.dynamic_entries if isinstance(e, lief.ELF.DynamicEntryLibrary)]
    assert needed[0] == "libproteus.so"  # first: its dlsym precedes libc's
    runpath = [e for e in b.dynamic_entries if isinstance(e, (lief.ELF.DynamicEntryRunPath, lief.ELF.DynamicEntryRpath))]
    assert len(runpath) == 1 and runpath[0].paths[0] == "$ORIGIN"
    record = json.loads(bytes(b.get_section(".proteus_rewrite").content))
    assert record["original_sha256"] == before and record["tool"].startswith("proteus-rewrite ")
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    assert f"libproteus.so => {tmp_path}/libproteus.so" in ldd
    assert os.access(exe, os.X_OK)
    # main and exit go through the shim's wrappers (they wait for its threads before exit
    # handlers run): the executable's references bind to libproteus.so, not to libc
    env = dict(os.environ, LD_DEBUG="bindings", PROTEUS_DISABLE="1")
    env.pop("LD_PRELOAD", None)
    trace = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60).stderr
    if "libcuda.so.1: cannot open" in trace:
        return  # the driver_api sample links libcuda, which a machine without a GPU lacks: it never starts
    for sym in ("__libc_start_main", "exit"):
        assert re.search(rf"binding file {re.escape(str(exe))} \[0\] to {re.escape(str(tmp_path))}/libproteus.so \[0\]: "
                         rf"normal symbol `{sym}'", trace), sym


def test_the_runtime_the_shim_imports_is_left_compiled(samples, tmp_path, monkeypatch):
    """The shim's interpreter inherits PYTHONDONTWRITEBYTECODE from the app (set on the H100
    host): without .pyc files every app start compiled the runtime from source, 190-275 ms there,
    which a first launch can wait for. Rewriting an app leaves them written and fresh."""
    import importlib.util

    import proteus_rewrite.runtime.trace as module
    pyc = importlib.util.cache_from_source(module.__file__)
    if os.path.exists(pyc):
        os.unlink(pyc)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")   # the CLI's own imports write none
    rewrite(samples, "loop_count", tmp_path / "out")
    assert os.path.exists(pyc) and os.path.getmtime(pyc) >= os.path.getmtime(module.__file__)


def test_only_the_intended_parts_change(samples, tmp_path):
    exe = rewrite(samples, "loop_count", tmp_path)
    a, b = lief.ELF.parse(str(samples / "loop_count")), lief.ELF.parse(str(exe))
    content = {s.name: bytes(s.content) for s in b.sections if s.type != lief.ELF.Section.TYPE.NOBITS}
    for name in (".text", ".rodata", ".nv_fatbin", ".init", ".fini", ".eh_frame"):
        assert content[name] == bytes(a.get_section(name).content), name
    assert {s.name for s in b.sections} - {s.name for s in a.sections} == {".proteus_rewrite"}
    ta, tb = extract(samples / "loop_count"), extract(exe)
    assert [f.sha256 for f in ta.fatbins] == [f.sha256 for f in tb.fatbins]  # the shim still recognizes them
    assert ta.kernels == tb.kernels and ta.modules == tb.modules


def test_rewritten_binary_behaves_like_the_original_with_the_jit_disabled(samples, tmp_path):
    """Here without a GPU both stop at the same CUDA error; on the GPU host both print the
    same checksums (tests/gpu/test_gpu_shim.py runs the rewritten binaries with the JIT on)."""
    exe = rewrite(samples, "loop_count", tmp_path)
    env = dict(os.environ, PROTEUS_DISABLE="1")
    a = subprocess.run([str(samples / "loop_count")], capture_output=True, text=True, env=env)
    b = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_stripped_binaries_are_rewritten(samples, tmp_path):
    stripped = tmp_path / "in" / "loop_count"
    stripped.parent.mkdir()
    shutil.copy(samples / "loop_count", stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    proc = run_cli(str(stripped), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    inspect = run_cli("inspect", "--json", str(tmp_path / "out" / "loop_count"))
    doc = json.loads(inspect.stdout)
    assert doc["app"]["stripped"] and doc["app"]["rewritten"]["original_sha256"] == hashlib.sha256(stripped.read_bytes()).hexdigest()


def test_inspect_says_whether_and_by_what_a_file_was_rewritten(samples, tmp_path):
    exe = rewrite(samples, "loop_count", tmp_path)
    assert "rewritten by proteus-rewrite" in run_cli("inspect", str(exe)).stdout
    assert json.loads(run_cli("inspect", "--json", str(samples / "loop_count")).stdout)["app"]["rewritten"] is None


def test_a_rewritten_input_is_refused_unless_forced(samples, tmp_path):
    exe = rewrite(samples, "loop_count", tmp_path / "a")
    before = exe.read_bytes()
    proc = run_cli(str(exe), "-o", str(tmp_path / "b"))
    assert proc.returncode == 11 and "already rewritten" in proc.stderr and "--force" in proc.stderr
    assert not (tmp_path / "b").exists() and exe.read_bytes() == before
    again = rewrite(exe.parent, "loop_count", tmp_path / "b", "--force")
    b = lief.ELF.parse(str(again))
    needed = [e.name for e in b.dynamic_entries if isinstance(e, lief.ELF.DynamicEntryLibrary)]
    assert needed.count("libproteus.so") == 1
    record = json.loads(bytes(b.get_section(".proteus_rewrite").content))
    assert record["original_sha256"] == hashlib.sha256((samples / "loop_count").read_bytes()).hexdigest()


def test_output_over_the_input_is_refused(samples, tmp_path):
    app = tmp_path / "loop_count"
    shutil.copy(samples / "loop_count", app)
    before = app.read_bytes()
    proc = run_cli(str(app), "-o", str(tmp_path))
    assert proc.returncode == 11 and "would replace the input" in proc.stderr
    assert app.read_bytes() == before and not (tmp_path / "loop_count.kstore").exists()


def test_non_cuda_input_is_refused(tmp_path):
    shutil.copy("/bin/true", tmp_path / "true")
    proc = run_cli(str(tmp_path / "true"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 4 and "no .nv_fatbin section" in proc.stderr
    assert not (tmp_path / "out").exists()
