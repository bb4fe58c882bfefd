"""Every exit code the command line documents, each triggered for real through the console entry
point: the code, and stderr one line that names the file, option or variable, no traceback.
Then the failures that used to pass for success, or succeed and then fail (issue #48)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proteus_rewrite.errors import EXIT_CODES

from ..conftest import ROOT, run_cli
from .test_bad_input import CASES

AXPY = "_Z9axpy_loopiifPKfPf"


def cli(*args: str, env: dict | None = None, cwd=None, prefix: tuple[str, ...] = (), patch: str = "",
        ) -> subprocess.CompletedProcess:
    """run_cli with `env` over the environment less its PROTEUS_* variables, a command to run it
    under (unshare) and Python to run first (`patch`). Compilations run in this process, the
    quicker way."""
    code = "import sys; " + (patch + "; " if patch else "") + \
        "from proteus_rewrite.cli import run; sys.argv[0] = 'proteus-rewrite'; run()"
    full = {k: v for k, v in os.environ.items() if not k.startswith("PROTEUS_")}
    full.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), PROTEUS_COMPILE_PROCESS="0",
                **(env or {}))
    return subprocess.run([*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=full)


def one_line(proc: subprocess.CompletedProcess, *names: str) -> str:
    """The one line of stderr, which must name each of `names`."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.match(r"proteus-rewrite: (internal )?error: ", lines[0]), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def as_plain_user() -> tuple[str, ...]:
    """What to run a command under so that file permissions hold: root reads and writes anything,
    so as root, a user namespace where this user is uid 1000 and owns no capabilities."""
    if os.geteuid() != 0:
        return ()
    prefix = ("unshare", "--map-user=1000", "--map-group=1000")
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, and no user namespace to drop the override of file permissions")
    return prefix


@pytest.fixture(scope="module")
def recorded(samples, tmp_path_factory) -> Path:
    """samples/loop_count rewritten: the directory with its store, the shim and the executable."""
    out = tmp_path_factory.mktemp("recorded") / "loop_count"
    proc = run_cli(str(samples / "loop_count"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def report(tmp_path) -> Path:
    """A PROTEUS_REPORT of a run of loop_count that used two variants of axpy_loop."""
    def launch(iters):
        return {"args": {"0": (1024).to_bytes(4, "little").hex(), "1": iters.to_bytes(4, "little").hex()},
                "grid": [4, 1, 1], "block": [256, 1, 1], "arch": 90}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"kernels": [{"name": AXPY, "variants": [{"launch": launch(2)}, {"launch": launch(3)}]}]}))
    return path


def fake_app(tmp_path, recorded, script: str) -> Path:
    """A directory that looks rewritten (a store and libproteus.so beside the app), whose app is
    a shell script: validate's outcomes without a GPU."""
    d = tmp_path / "fake"
    d.mkdir()
    shutil.copy(recorded / "loop_count.kstore", d)
    (d / "libproteus.so").write_bytes(b"")
    app = d / "app"
    app.write_text("#!/bin/sh\n" + script + "\n")
    app.chmod(0o755)
    return app


# ---------------------------------------------------------------- one test per exit code


def test_0_ok_with_the_shared_options_where_users_put_them(samples, tmp_path):
    app = str(samples / "loop_count")
    for i, args in enumerate((["-v", app, "-o", "{}"], [app, "-v", "-o", "{}"], [app, "-o", "{}", "-v"],
                              [app, "-o", "{}", "-vv"], ["-v", "rewrite", app, "-o", "{}", "-v"])):
        out = tmp_path / f"out{i}"
        proc = cli(*(a.format(out) for a in args))
        assert proc.returncode == 0, (args, proc.stderr)
        assert "recorded 3 kernel(s)" in proc.stdout and (out / "loop_count.kstore").is_file()
    for args in (["inspect", app, "-v"], ["-v", "inspect", app], ["inspect", "-v", "--json", app]):
        assert cli(*args).returncode == 0, args
    assert cli("cache", "stats", "--dir", str(tmp_path / "c"), "-v").returncode == 0
    assert cli("inspect", "--version").stdout == cli("--version").stdout != ""


def test_verbose_counts_wherever_it_is_given(samples):
    app = str(samples / "loop_count")
    show_level = ("import logging, proteus_rewrite.cli.inspect as m; load = m.load; "
                  "m.load = lambda p: (print('log level', logging.getLogger().level, file=sys.stderr), load(p))[1]")
    for args, level in ((["inspect", app], 30), (["inspect", app, "-v"], 20), (["-v", "inspect", app, "-v"], 10)):
        proc = cli(*args, patch=show_level)
        assert proc.returncode == 0 and f"log level {level}" in proc.stderr, (args, proc.stderr)


def test_1_internal_error_is_one_line_without_a_traceback(samples):
    boom = ("import proteus_rewrite.cli.inspect as m; "
            "m.load = lambda path: (_ for _ in ()).throw(RuntimeError('an unexpected failure\\nover two lines'))")
    proc = cli("inspect", str(samples / "loop_count"), patch=boom)
    assert proc.returncode == 1
    line = one_line(proc, "RuntimeError: an unexpected failure over two lines", "PROTEUS_DEBUG=1")
    assert line.startswith("proteus-rewrite: internal error: ")


def test_1_prewarm_a_variant_the_cache_did_not_take(recorded, report, tmp_path):
    proc = cli("prewarm", str(recorded), "--from", str(report), "--cache-dir", str(tmp_path / "c"),
               env={"PROTEUS_FAULT_INJECT": "cache-readonly"})
    assert proc.returncode == 1, proc.stderr
    assert "prewarm: 2 compiled, 2 not stored -> " in proc.stderr
    # the cache's warning once, not once a variant
    assert proc.stderr.count("cannot write a cache entry: Read-only file system (injected)") == 1, proc.stderr
    assert not list((tmp_path / "c").glob("*.pjc"))


def test_2_usage_an_argument(recorded):
    proc = cli("specialize", str(recorded / "loop_count.kstore"), "axpy_loop", "--block", "2048")
    assert proc.returncode == 2
    one_line(proc, "--block", "2048 threads; a block has at most 1024", "specialize --help")


def test_2_usage_a_proteus_variable(tmp_path):
    proc = cli("cache", "stats", "--dir", str(tmp_path), env={"PROTEUS_CACHE_MAX_MB": "abc"})
    assert proc.returncode == 2
    one_line(proc, "PROTEUS_CACHE_MAX_MB='abc'", "expected a positive number")


def test_3_input_missing(tmp_path):
    proc = cli("inspect", str(tmp_path / "missing"))
    assert proc.returncode == 3
    one_line(proc, f"{tmp_path / 'missing'}: no such file")


@pytest.mark.parametrize("code, case", [(4, "not an ELF"), (5, "container magic"), (6, "SASS-only nvcc binary"),
                                        (7, "bitcode LLVM cannot parse")])
def test_4_to_7_what_the_input_holds(samples, tmp_path, code, case):
    make, expected, reason = CASES[case]
    assert expected == code
    path = make(samples, tmp_path)
    proc = cli("inspect", str(path))
    assert proc.returncode == code
    one_line(proc, str(path), reason)


def test_8_kernel_store(report, tmp_path):
    (tmp_path / "empty").mkdir()
    proc = cli("prewarm", str(tmp_path / "empty"), "--from", str(report), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode == 8
    one_line(proc, str(tmp_path / "empty"), "no .kstore file in the directory (not written by proteus-rewrite?)")


def test_9_specialization(recorded):
    kstore = str(recorded / "loop_count.kstore")
    proc = cli("specialize", kstore, "axpy_loop", "--arg", "1=8", env={"PROTEUS_FAULT_INJECT": "ptx"})
    assert proc.returncode == 9
    one_line(proc, kstore, "injected fault: ptx failed")


def test_10_cache(tmp_path):
    (tmp_path / "file").write_text("")
    proc = cli("cache", "stats", env={"PROTEUS_CACHE_DIR": str(tmp_path / "file")})
    assert proc.returncode == 10
    one_line(proc, f"{tmp_path / 'file'}: cannot read the cache directory: not a directory")


def test_11_rewrite(recorded, tmp_path):
    proc = cli(str(recorded / "loop_count"), "-o", str(tmp_path / "again"))
    assert proc.returncode == 11
    one_line(proc, str(recorded / "loop_count"), "already rewritten", "--force")
    assert not (tmp_path / "again").exists()


def test_12_validation(recorded, tmp_path):
    app = fake_app(tmp_path, recorded, "exit 1")  # dies before the run time writes its report
    proc = cli("validate", str(app), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode == 12
    one_line(proc, str(app), "the app wrote no report (it exited 1")


def test_13_no_gpu(recorded, tmp_path):
    app = fake_app(tmp_path, recorded, 'echo \'{"no_gpu": "cuInit failed", "kernels": []}\' > "$PROTEUS_REPORT"')
    proc = cli("validate", str(app), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode == 13
    one_line(proc, str(app), "no usable GPU: cuInit failed")


def test_every_code_has_a_test_above():
    tested = {code for first, last in re.findall(r"^def test_(\d+)(?:_to_(\d+))?_", Path(__file__).read_text(), re.M)
              for code in range(int(first), int(last or first) + 1)}
    assert tested == set(EXIT_CODES), set(EXIT_CODES) ^ tested


def test_the_docs_table_and_help_match_the_codes():
    doc = (ROOT / "docs" / "user" / "usage.md").read_text()
    section = doc.split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| ([^|]*) \|", section, re.M))
    assert {int(c) for c in rows} == set(EXIT_CODES)
    for code, meaning in EXIT_CODES.items():
        assert rows[str(code)].strip() == meaning, code
    help_text = " ".join(run_cli("--help").stdout.split())
    assert "Exit codes: " + "; ".join(f"{c} {m}" for c, m in EXIT_CODES.items()) in help_text


# ---------------------------------------------------------------- issue #48, item 3


def test_prewarm_into_a_read_only_cache_says_so_before_compiling(recorded, report, tmp_path):
    prefix = as_plain_user()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    proc = cli("prewarm", str(recorded), "--from", str(report), "--cache-dir", str(ro), prefix=prefix)
    assert proc.returncode == 10
    one_line(proc, f"{ro}: cannot write a cache entry: Permission denied")


def test_prewarm_into_a_cache_directory_that_is_a_file(recorded, report, tmp_path):
    (tmp_path / "file").write_text("")
    proc = cli("prewarm", str(recorded), "--from", str(report), env={"PROTEUS_CACHE_DIR": str(tmp_path / "file")})
    assert proc.returncode == 10
    one_line(proc, f"{tmp_path / 'file'}: cannot write a cache entry: not a directory")


def test_prewarm_stores_where_flock_fails(recorded, report, tmp_path):
    """A file system without file locks (#52): flock answers ENOSYS, from a preloaded library."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler for the library that makes flock fail")
    (tmp_path / "noflock.c").write_text("#include <errno.h>\nint flock(int fd, int op) { errno = ENOSYS; return -1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "noflock.so"), str(tmp_path / "noflock.c")], check=True)
    probe = subprocess.run([sys.executable, "-c", "import fcntl, sys; fcntl.flock(sys.stdout.fileno(), fcntl.LOCK_EX)"],
                           env=dict(os.environ, LD_PRELOAD=str(tmp_path / "noflock.so")), capture_output=True, text=True)
    assert "Function not implemented" in probe.stderr, probe.stderr  # the library works: flock fails
    cache = tmp_path / "c"
    proc = cli("prewarm", str(recorded), "--from", str(report), "--cache-dir", str(cache),
               env={"LD_PRELOAD": str(tmp_path / "noflock.so")})
    assert proc.returncode == 0, proc.stderr
    assert "prewarm: 2 compiled -> " in proc.stderr and "WARNING" not in proc.stderr
    entries = list(cache.glob("*.pjc"))
    assert len(entries) == 3  # the two variants and the note of the run
    assert int((cache / ".usage").read_text()) == sum(p.stat().st_size for p in entries)


def test_a_cache_put_without_file_locks_stores_and_counts(tmp_path, monkeypatch):
    import errno
    import fcntl

    from proteus_rewrite.cache import Entry, StorageCache, make_chain

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    chain = make_chain(True, str(tmp_path), 1)
    for i in range(3):
        chain.put(Entry(f"k{i}", "ptx", 90, bytes(1000 * (i + 1))))
    disk = chain.levels[-1]
    assert isinstance(disk, StorageCache) and not chain.put_errors
    assert all(disk.get(f"k{i}") is not None for i in range(3))
    assert int((tmp_path / ".usage").read_text()) == sum(st.st_size for _, st in disk.entries())


@pytest.mark.parametrize("command", ["ls", "stats", "clear"])
@pytest.mark.parametrize("how", ["--dir", "PROTEUS_CACHE_DIR"])
def test_cache_commands_on_a_directory_that_is_a_file(tmp_path, command, how):
    path = tmp_path / "file"
    path.write_text("")
    proc = (cli("cache", command, "--dir", str(path)) if how == "--dir"
            else cli("cache", command, env={"PROTEUS_CACHE_DIR": str(path)}))
    assert proc.returncode == 10
    one_line(proc, f"{path}: cannot read the cache directory: not a directory")


def test_cache_clear_on_a_read_only_cache(recorded, report, tmp_path):
    prefix = as_plain_user()
    cache = tmp_path / "c"
    assert cli("prewarm", str(recorded), "--from", str(report), "--cache-dir", str(cache)).returncode == 0
    before = sorted(cache.iterdir())
    cache.chmod(0o555)
    proc = cli("cache", "clear", "--dir", str(cache), prefix=prefix)
    assert proc.returncode == 10
    one_line(proc, f"{cache}: cannot delete cache entries: Permission denied")
    assert sorted(cache.iterdir()) == before


@pytest.mark.parametrize("command", [["inspect", "{f}"], ["rewrite", "{f}", "-o", "{out}"], ["{f}", "-o", "{out}"],
                                     ["report", "{f}"], ["prewarm", "{recorded}", "--from", "{f}"],
                                     ["prewarm", "{f}", "--from", "{report}"], ["specialize", "{f}", "axpy_loop"],
                                     ["validate", "{f}"], ["rewrite", "{app}", "-o", "{out}", "--lib", "{f}"]],
                         ids=lambda c: " ".join(c))
def test_an_unreadable_input_is_one_line_and_exit_3(samples, recorded, report, tmp_path, command):
    prefix = as_plain_user()
    f = tmp_path / "unreadable"
    f.write_bytes((samples / "loop_count").read_bytes())
    f.chmod(0)
    out = tmp_path / "out"
    args = [a.format(f=f, out=out, recorded=recorded, report=report, app=samples / "loop_count") for a in command]
    proc = cli(*args, prefix=prefix, env={"PROTEUS_CACHE_DIR": str(tmp_path / "c")})
    assert proc.returncode == 3, proc.stderr
    one_line(proc, str(f), "ermission denied")
    assert not out.exists()


@pytest.mark.parametrize("variable, value", [("PROTEUS_CACHE_MAX_MB", "abc"), ("PROTEUS_OPT_LEVEL", "9"),
                                             ("PROTEUS_SPECIALIZE_ARGS", "maybe")])
@pytest.mark.parametrize("command", ["specialize", "prewarm", "cache"])
def test_a_bad_proteus_variable_is_a_usage_error_named_before_any_work(recorded, report, tmp_path, variable, value,
                                                                     command):
    args = {"specialize": ["specialize", str(recorded / "loop_count.kstore"), "axpy_loop"],
            "prewarm": ["prewarm", str(recorded), "--from", str(report), "--cache-dir", str(tmp_path / "c")],
            "cache": ["cache", "stats", "--dir", str(tmp_path / "c")]}[command]
    proc = cli(*args, env={variable: value})
    assert proc.returncode == 2
    one_line(proc, f"{variable}={value!r}")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args, message", [
    (["--arg", "0=abc"], "argument 0 (i32) takes an integer"),
    (["--arg", "2=abc"], "argument 2 (float) takes a number"),
    (["--arg", "0=99999999999"], "argument 0 (i32) takes an integer from -2147483648 to 4294967295"),
    (["--arg", "3=4096"], "argument 3 is a pointer (ptr): pointers are never folded"),
    (["--arg", "5=1"], "has 5 argument(s): N is 0 to 4"),
    (["--arg", "1"], "expected N=VALUE"),
    (["--arg", "1=2", "--arg", "1=3"], "argument 1 is given twice"),
    (["--block", "2048"], "2048 threads; a block has at most 1024"),
    (["--block", "64,32"], "2048 threads; a block has at most 1024"),
    (["--block", "1,1,65"], "a block is at most 1024,1024,64"),
    (["--grid", "2147483648"], "a grid is at most 2147483647,65535,65535"),
    (["--grid", "1,65536"], "a grid is at most 2147483647,65535,65535"),
    (["--grid", "1,1,65536"], "a grid is at most 2147483647,65535,65535"),
    (["--global", "table=0x1000"], "uses no device variable 'table'"),
    (["-o", "/nonexistent-dir/k.ptx"], "no directory '/nonexistent-dir'"),
])
def test_specialize_checks_every_argument_before_compiling(recorded, args, message):
    # with every compilation failing, a check made after compiling would exit 9, not 2
    proc = cli("specialize", str(recorded / "loop_count.kstore"), "axpy_loop", *args, env={"PROTEUS_FAULT_INJECT": "ptx"})
    assert proc.returncode == 2, proc.stderr
    one_line(proc, message, args[0])
    assert proc.stdout == ""


def test_specialize_refuses_a_struct_and_a_block_past_the_launch_bounds(samples):
    proc = cli("specialize", str(samples / "templates"), "affine", "--arg", "0=" + "00" * 24)
    assert proc.returncode == 2
    one_line(proc, "is a struct passed by value: only integer, floating-point and bool arguments are folded")
    proc = cli("specialize", str(samples / "templates"), "bounded_sum", "--block", "256")
    assert proc.returncode == 2
    one_line(proc, "256 threads; bounded_sum(float const*, float*, int, int) is declared with __launch_bounds__(128)")


def test_specialize_takes_a_pointer_for_its_alignment_and_the_limits_themselves(recorded):
    kstore = str(recorded / "loop_count.kstore")
    proc = cli("specialize", kstore, "axpy_loop", "--arg", "3=4096", "--emit", "ir",
               env={"PROTEUS_SPECIALIZE_ALIGNMENT": "1"})
    assert proc.returncode == 0, proc.stderr
    proc = cli("specialize", kstore, "axpy_loop", "--block", "16,1,64", "--grid", "2147483647,65535,65535",
               "--emit", "ir")
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- issue #48, item 4


def test_a_verbose_flag_after_the_output_is_not_taken_for_the_apps(samples, tmp_path):
    proc = cli(str(samples / "loop_count"), "-o", str(tmp_path / "d"), "-v")
    assert proc.returncode == 0 and "unexpected arguments" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("extra, shown", [(["bogus"], "'bogus'"), (["--", "-v"], "'-v'")])
def test_what_rewrite_cannot_take_is_refused_before_anything_is_written(samples, tmp_path, extra, shown):
    """Arguments for the app only go with --validate; after --, even -v is the app's."""
    proc = cli(str(samples / "loop_count"), "-o", str(tmp_path / "d"), *extra)
    assert proc.returncode == 2
    one_line(proc, f"unexpected arguments {shown}", "--validate")
    assert proc.stdout == "" and not (tmp_path / "d").exists()


def test_a_rewrite_option_before_the_app_still_means_rewrite(samples, tmp_path):
    proc = cli("-o", str(tmp_path / "d"), str(samples / "loop_count"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "d" / "loop_count.kstore").is_file()
    proc = cli("--bogus")
    assert proc.returncode == 2
    one_line(proc, "No such option '--bogus'")

