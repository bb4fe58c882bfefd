"""The run time's compiler process (jit/process.py): the same code as compiling here, errors
as here, a crash is one failed variant, a fork's child starts its own, and the shim never
follows the compiler into it."""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest

from proteus_rewrite import runtime
from proteus_rewrite.errors import SpecializeError
from proteus_rewrite.jit import Config, codegen, process, specializer

from ..conftest import run_cli
from ..support.launches import kernel, launch_for


@pytest.fixture
def compilers():
    return process.Compilers(sys.executable, 1)


def test_a_variant_compiled_in_the_process_is_the_one_compiled_here(table, compilers):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    launch = launch_for(k, {0: "4096", 1: "16", 2: "0.5"})
    here = specializer.specialize(t, k, launch, Config(), driver_version=13000)
    there = specializer.specialize(t, k, launch, Config(), driver_version=13000, compiler=compilers)
    assert there.key == here.key and there.image == here.image and there.ptx == here.ptx
    assert {"ir", "optimize", "ptx", "cubin", "process"} <= set(there.timings_ms)
    # its second request sends no bitcode: the process kept the module
    again = specializer.specialize(t, k, launch_for(k, {0: "4096", 1: "17", 2: "0.5"}), Config(), driver_version=13000,
                                   compiler=compilers)
    assert again.key != here.key and compilers.report()["processes_started"] == 1


def test_the_compiler_process_compiles_with_the_nvjitlink_this_process_located(table, compilers):
    """The process starts without site handling (python -S), where cuda-pathfinder's search of
    site-packages misses a venv's: it must load the file its parent located, which is the
    nvidia-nvjitlink wheel on this interpreter's path (a dependency), not the toolkit's."""
    lib = codegen.locate_nvjitlink()
    assert lib is not None and lib.version is not None, "the nvidia-nvjitlink wheel is on sys.path"
    assert any(os.path.realpath(lib.path).startswith(os.path.realpath(p) + os.sep) for p in sys.path if p)
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    nvjitlink = Config.from_env({"PROTEUS_PTX_COMPILER": "nvjitlink"})   # auto may take a toolkit's ptxas
    result = specializer.specialize(t, k, launch_for(k, {1: "11"}), nvjitlink, driver_version=13000, compiler=compilers)
    assert isinstance(result.image, codegen.Cubin) and result.image.data[:4] == b"\x7fELF"
    assert compilers.report()["nvjitlink"] == os.path.realpath(lib.path)


def test_ready_waits_for_the_warm_up_and_the_next_request_reads_its_own_answer(table, compilers):
    """A compile thread waits for the process's warm-up before it reads the tracker's policy
    (runtime.specialize): after ready() every request posted has its answer read, and the
    compilation that follows gets its own answer, not the warm-up's."""
    compilers.start(75, Config().for_kernel("proteus_warm_up"), 13000)
    worker = compilers._idle[0]
    assert worker.last_id < worker.next_id  # the warm-up is posted, not answered yet
    compilers.ready()
    assert compilers._idle == [worker] and worker.last_id == worker.next_id == 1
    compilers.ready()  # nothing outstanding: returns at once
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    there = specializer.specialize(t, k, launch_for(k, {1: "5"}), Config(), driver_version=13000, compiler=compilers)
    assert there.image and worker.last_id == worker.next_id == 2 and compilers.report()["processes_started"] == 1


def test_a_failure_in_the_process_is_the_error_it_would_be_here(table, compilers, monkeypatch):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "optimize")  # read per request, not when the process started
    with pytest.raises(SpecializeError, match="^injected fault: optimize failed$"):
        specializer.specialize(t, k, launch_for(k, {1: "3"}), Config(), driver_version=13000, compiler=compilers)
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "")
    assert specializer.specialize(t, k, launch_for(k, {1: "3"}), Config(), driver_version=13000, compiler=compilers).image


def test_a_crash_fails_one_variant_and_repeated_crashes_stop_compiling(table, compilers, monkeypatch):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "compiler-crash")
    for i in range(process.MAX_DEATHS):
        with pytest.raises(SpecializeError, match="^the compiler process killed by SIGKILL$"):
            specializer.specialize(t, k, launch_for(k, {1: str(i)}), Config(), driver_version=13000, compiler=compilers)
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "")
    with pytest.raises(SpecializeError, match="3 compiler processes died; this run compiles no more"):
        specializer.specialize(t, k, launch_for(k, {1: "9"}), Config(), driver_version=13000, compiler=compilers)
    assert compilers.report()["deaths"] == 3


def test_a_compiler_that_cannot_start_says_how_to_see_why(table, tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    with pytest.raises(SpecializeError, match=r"^the compiler process exited with status 3 before answering "
                                              r"\(PROTEUS_TRACE_OUTPUT=specialization shows its errors; "
                                              r"PROTEUS_COMPILE_PROCESS=0 compiles in the app\)$"):
        specializer.specialize(t, k, launch_for(k, {1: "4"}), Config(), driver_version=13000,
                               compiler=process.Compilers(str(fake), 1))


def test_a_request_that_cannot_be_sent_gives_its_process_back(table, compilers):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):  # a bug of ours: it must not keep the only process
        compilers.compile(t, k, lambda: None, None, 90, 90, False, {})
    assert compilers.report()["deaths"] == 0
    assert specializer.specialize(t, k, launch_for(k, {1: "3"}), Config(), driver_version=13000, compiler=compilers).image


def test_a_forked_child_starts_a_process_of_its_own(table, compilers):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    specializer.specialize(t, k, launch_for(k, {1: "5"}), Config(), driver_version=13000, compiler=compilers)
    pid = os.fork()
    if pid == 0:  # the child: its parent's process must not serve it (their frames would interleave)
        code = 1
        try:
            r = specializer.specialize(t, k, launch_for(k, {1: "6"}), Config(), driver_version=13000, compiler=compilers)
            code = 0 if r.image and compilers.report()["processes_started"] == 1 else 2  # its own, counted alone
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert specializer.specialize(t, k, launch_for(k, {1: "7"}), Config(), driver_version=13000, compiler=compilers).image
    assert compilers.report()["processes_started"] == 1


def test_the_shim_is_kept_out_of_the_compiler_process():
    env = process.child_environment({"LD_PRELOAD": "/a/libasan.so:/out/app/libproteus.so /b/libx.so", "HOME": "/h"}, ["/p", "", "/q"])
    assert env == {"LD_PRELOAD": "/a/libasan.so /b/libx.so", "HOME": "/h", "PYTHONPATH": os.pathsep.join(["/p", "/q"]),
                   "CUDA_VISIBLE_DEVICES": ""}  # and no GPU: it only compiles
    assert "LD_PRELOAD" not in process.child_environment({"LD_PRELOAD": "/out/libproteus.so"}, [])


def test_the_python_proteus_rewrite_recorded_runs_the_compiler(tmp_path):
    assert process.python_executable(str(tmp_path / "missing")) == sys.executable
    (tmp_path / "python3").write_text("#!/bin/sh\n")
    (tmp_path / "python3").chmod(0o755)
    assert process.python_executable(str(tmp_path / "python3")) == str(tmp_path / "python3")


def test_the_prestart_starts_the_compiler_process_and_compiles_nothing_here(samples, tmp_path, monkeypatch):
    """runtime.prepare_compiler(0, ahead=1), as the shim's prestart thread calls it: one process
    started (it warms up by itself), no warm-up in this process; the report says where variants
    compile. With PROTEUS_COMPILE_PROCESS=0, the warm-up runs here."""
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path)).returncode == 0
    cfg = (tmp_path / "proteus-python.cfg").read_text()
    assert f"executable {sys.executable}\n" in cfg
    here = []
    monkeypatch.setattr(specializer, "warm_up", lambda arch, *a, **k: here.append(arch) or 1.0)
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    runtime.reset()
    assert runtime.init(str(tmp_path), 13000)
    assert runtime.prepare_compiler(0, 1) and here == []
    runtime.write_report(str(tmp_path / "r.json"), b"")
    assert json.loads((tmp_path / "r.json").read_text())["compiler_process"] == {
        "python": sys.executable, "processes_started": 1, "deaths": 0,
        "start_ms": runtime.state().compiler.report()["start_ms"], "nvjitlink": None}  # its warm-up not answered yet
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    runtime.reset()
    assert runtime.init(str(tmp_path), 13000)
    assert runtime.prepare_compiler(0, 1) and here == [runtime.WARM_UP_ARCH]
    assert runtime.state().compiler is None
    runtime.reset()


def test_an_app_that_exits_with_the_answer_unread_ends_the_compiler_quietly():
    """An app that exits before reading what the process sent (its "started" frame, a warm-up's
    answer: every warm run that prestarts the compiler and then compiles nothing) resets the
    socket; the process printed that reset's traceback into the app's stderr (H100, lulesh)."""
    import select
    import socket
    import subprocess

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = process.child_environment(os.environ, process.import_path())
    proc = subprocess.Popen([sys.executable, "-S", "-m", "proteus_rewrite.jit.process"], stdin=theirs, stdout=theirs,
                            stderr=subprocess.PIPE, env=env, close_fds=True)
    theirs.close()
    assert select.select([mine], [], [], 60)[0], "the process says it started"
    mine.close()  # unread: a reset, not an EOF
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b""
