"""Apps whose kernels live in shared libraries: `proteus-rewrite APP` finds the needed
libraries that hold kernels and records each beside the app; the advice printed for a
library, an object file and a Python extension; the loader's search as fatbin/libraries.py
follows it."""

from __future__ import annotations

import json
import os
import shlex
import shutil

import lief
import pytest

from proteus_rewrite import store
from proteus_rewrite.fatbin import libraries

from ..conftest import ROOT, run_cli


def runpath(exe) -> list[str]:
    binary = lief.ELF.parse(str(exe))
    for e in binary.dynamic_entries:
        if isinstance(e, (lief.ELF.DynamicEntryRunPath, lief.ELF.DynamicEntryRpath)):
            return list(e.paths)
    return []


def test_an_app_without_kernels_of_its_own_records_its_library(samples, tmp_path):
    app = samples / "shared_lib"
    proc = run_cli(str(app), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["libproteus.so", "libshared_lib.so.kstore", "proteus-python.cfg", "shared_lib"], written
    table = store.read(tmp_path / "out" / "libshared_lib.so.kstore")
    assert {k.demangled.split("(")[0].split()[-1] for k in table.kernels_with_bitcode} == {"polynomial", "smooth"}
    assert f"{samples / 'libshared_lib.so'}: recorded 2 kernel(s), 2 with bitcode" in proc.stdout
    assert proc.stderr == ""
    # the copy finds the library beside the original, wherever the output directory is
    assert runpath(tmp_path / "out" / "shared_lib")[:2] == ["$ORIGIN", str(samples)]


@pytest.mark.parametrize("app", ["shared_lib_dynamic", "two_tu_shared"])
def test_the_app_and_its_library_each_get_a_store(samples, tmp_path, app):
    exe = samples / app
    proc = run_cli(str(exe), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    stores = sorted(p.name for p in (tmp_path / "out").glob("*.kstore"))
    expect = [f"lib{app}.so.kstore"] + ([f"{app}.kstore"] if app == "two_tu_shared" else [])
    assert stores == sorted(expect)


def test_libraries_follow_the_loaders_search(samples):
    found = {os.path.basename(lib.name): lib for lib in libraries.needed(samples / "two_tu_shared")}
    ours = found["libtwo_tu_shared.so"]
    assert ours.gpu and not ours.vendor and os.path.samefile(ours.path, samples / "libtwo_tu_shared.so")
    cudart = next(lib for name, lib in found.items() if name.startswith("libcudart.so"))
    assert cudart.vendor and not cudart.gpu  # listed, not read: vendor libraries carry no bitcode
    assert found["libc.so.6"].vendor
    assert [lib.path for lib in libraries.with_gpu_code(samples / "two_tu_shared")] == [ours.path]


def test_ld_library_path_finds_a_library_runpath_does_not(samples, tmp_path, monkeypatch):
    moved = tmp_path / "bin"
    moved.mkdir()
    shutil.copy(samples / "shared_lib", moved / "main")  # $ORIGIN no longer has the library
    assert [lib.path for lib in libraries.needed(moved / "main") if lib.name == "libshared_lib.so"] == [None]
    proc = run_cli(str(moved / "main"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 4
    assert proc.stderr.count("\n") == 2  # the warning naming the missing library, then the error
    assert "needs libshared_lib.so, which is not found from here" in proc.stderr
    assert "--lib" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written

    monkeypatch.setenv("LD_LIBRARY_PATH", str(samples))
    assert libraries.with_gpu_code(moved / "main")[0].path == str(samples / "libshared_lib.so")


def test_lib_names_a_library_the_app_opens_itself(samples, tmp_path):
    moved = tmp_path / "bin"
    moved.mkdir()
    shutil.copy(samples / "shared_lib", moved / "main")
    lib = samples / "libshared_lib.so"
    proc = run_cli(str(moved / "main"), "--lib", str(lib), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "libshared_lib.so.kstore").is_file()


def test_no_libs_records_the_app_alone(samples, tmp_path):
    proc = run_cli(str(samples / "shared_lib"), "--no-libs", "-o", str(tmp_path / "out"))
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no .nv_fatbin section" in proc.stderr and "--lib" in proc.stderr
    proc = run_cli(str(samples / "two_tu_shared"), "--no-libs", "-o", str(tmp_path / "out2"))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "out2").glob("*.kstore")] == ["two_tu_shared.kstore"]


def test_inspect_points_at_the_library_with_the_kernels(samples):
    proc = run_cli("inspect", str(samples / "shared_lib"))
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"its kernels are in {samples / 'libshared_lib.so'}" in proc.stderr


@pytest.mark.parametrize("name, advice", [
    ("libshared_lib.so", "a shared library: run the app that loads it with LD_PRELOAD="),
    ("kernels.cpython-311-x86_64-linux-gnu.so", "a Python extension module: run the Python that imports it with LD_PRELOAD="),
])
def test_a_library_gets_advice_for_how_it_is_loaded(samples, tmp_path, name, advice):
    spaced = tmp_path / "with space"
    spaced.mkdir()
    shutil.copy(samples / "libshared_lib.so", spaced / name)
    out = spaced / "out dir"
    proc = run_cli(str(spaced / name), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[-1]
    assert line.startswith(advice), line
    assert f"LD_PRELOAD='{out / 'libproteus.so'}'" in line  # quoted: the path has a space
    # a shell reads the printed assignment as one word
    assert shlex.split(line.split(" with ", 1)[1])[0] == f"LD_PRELOAD={out / 'libproteus.so'}"


def test_an_object_file_is_pointed_at_what_it_is_linked_into(tmp_path):
    from ..support.clang import build_cuda

    obj = build_cuda([samples_src("two_tu_kernels.cu")], tmp_path / "k.o", flags=("-c",))
    proc = run_cli(str(obj), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("an object file: record the executable or library it is linked into")


def samples_src(name: str):
    return ROOT / "samples" / "src" / name


def test_prewarm_compiles_the_variants_of_the_app_and_of_its_library(samples, tmp_path):
    """A directory with the app's store and its library's: prewarm finds each kernel in its own."""
    out = tmp_path / "out"
    assert run_cli(str(samples / "two_tu_shared"), "-o", str(out)).returncode == 0

    def launch(args: dict[str, bytes], grid: int, block: int) -> dict:
        return {"args": {i: v.hex() for i, v in args.items()}, "arch": 90, "grid": [grid, 1, 1], "block": [block, 1, 1],
                "globals": {}}

    n = (1 << 20).to_bytes(4, "little")
    report = {"driver_version": 13000, "kernels": [
        {"name": "_Z6squarePfi", "variants": [{"launch": launch({"1": n}, 4096, 256)}]},  # the executable's
        {"name": "_Z9histogramPKfiPji", "variants": [{"launch": launch({"1": n, "3": (64).to_bytes(4, "little")}, 4096, 256)}]},
    ]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    proc = run_cli("prewarm", str(out), "--from", str(path), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "prewarm: 2 compiled" in proc.stderr and "not in this store" not in proc.stderr, proc.stderr
