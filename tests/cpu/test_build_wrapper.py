"""proteus-clang++ (proteus_rewrite/cc.py): what it adds to a clang command line, the CUDA 13
compat tree it makes from the package, its errors, and the README's one-line build from a
plain pip install."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from proteus_rewrite import cc

from .test_install import installed  # noqa: F401  (the user's install: a venv, pip install of this checkout)

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ["-Xclang", "-fembed-bitcode=all", "-ffp-contract=on"]


@pytest.fixture
def toolkit(tmp_path) -> Path:
    """A stand-in CUDA 13 toolkit: the files the wrapper looks at, and a fatbinary that prints
    the arguments it was given."""
    cuda = tmp_path / "cuda-13.0"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda_runtime.h").write_text("")
    (cuda / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    (cuda / "include" / "texture_indirect_functions.h").write_text("")  # CUDA 13 has this one
    (cuda / "lib64").mkdir()
    (cuda / "nvvm").mkdir()
    (cuda / "bin").mkdir()
    for tool in ("fatbinary", "nvcc", "ptxas"):
        _script(cuda / "bin" / tool, 'for a do echo "$a"; done\n')
    (cuda / "bin" / "nvcc.profile").write_text("TOP = $(_HERE_)/..\n")
    return cuda


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake(cuda: Path):
    compat = cc.Compat(cuda, Path("/compat/cuda"), Path("/compat/stubs"))
    asked = []

    def get(path):
        asked.append(path)
        return compat
    get.asked = asked
    return compat, get


def _rewrite(args, cuda, env=None):
    compat, get = _fake(cuda)
    return cc.rewrite(args, env or {}, get), compat, get.asked


def _gpu_object(path: Path) -> Path:
    """Bytes as an ELF object's section-name table holds them, with clang's fat binary section."""
    path.write_bytes(b"\x7fELF" + b"\0" * 60 + b"\0.text\0.nv_fatbin\0.nvFatBinSegment\0")
    return path


# ------------------------------------------------------------------ the command line

def test_a_cuda_compile_gets_the_recipe_the_arch_and_the_compat_flags_before_the_users_and_no_libraries(toolkit):
    out, compat, _ = _rewrite(["-O3", "-c", "app.cu", "-o", "app.o"], toolkit)
    assert out == [*compat.compile_flags(), *RECIPE, "--cuda-gpu-arch=sm_90", "-O3", "-c", "app.cu", "-o", "app.o"]
    assert compat.compile_flags() == ["--cuda-path=/compat/cuda", "-isystem", "/compat/stubs",
                                      "-isystem", str(toolkit / "include" / "cccl"), "-Wno-unknown-cuda-version"]


def test_a_one_line_build_also_links_the_static_cudart_after_everything(toolkit):
    out, compat, _ = _rewrite(["-O3", "app.cu", "-o", "app"], toolkit)
    assert out[-5:] == [f"-L{toolkit / 'lib64'}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
    assert out[:-5] == [*compat.compile_flags(), *RECIPE, "--cuda-gpu-arch=sm_90", "-O3", "app.cu", "-o", "app"]


def test_linking_objects_adds_the_runtime_only_where_an_object_has_gpu_code(toolkit, tmp_path):
    gpu, plain = _gpu_object(tmp_path / "kernels.o"), tmp_path / "main.o"
    plain.write_bytes(b"\x7fELF" + b"\0" * 60 + b"\0.text\0.data\0")
    out, _, asked = _rewrite([str(plain), str(gpu), "-o", "app"], toolkit)
    assert out == [str(plain), str(gpu), "-o", "app", f"-L{toolkit / 'lib64'}", "-lcudart_static", "-ldl", "-lrt",
                   "-lpthread"]
    assert asked == [None]
    out, _, asked = _rewrite([str(plain), "-o", "app"], toolkit)
    assert out == [str(plain), "-o", "app"] and asked == []
    archive = _gpu_object(tmp_path / "libkernels.a")
    out, _, _ = _rewrite([str(plain), str(archive), "-o", "app"], toolkit)
    assert out[-4:] == list(cc.CUDART)
    # a shared library with GPU code has its runtime already: a second one is not linked in
    shared = _gpu_object(tmp_path / "libkernels.so.1")
    out, _, asked = _rewrite([str(plain), str(shared), "-o", "app"], toolkit)
    assert out == [str(plain), str(shared), "-o", "app"] and asked == []


def test_a_cudart_the_user_links_is_not_linked_twice_but_is_found(toolkit, tmp_path):
    gpu = str(_gpu_object(tmp_path / "k.o"))
    for lib in (["-lcudart"], ["-l", "cudart_static"]):
        out, _, _ = _rewrite([gpu, *lib, "-o", "app"], toolkit)
        assert out == [gpu, *lib, "-o", "app", f"-L{toolkit / 'lib64'}"]


def test_x_cuda_makes_any_file_cuda_until_x_none(toolkit):
    out, compat, _ = _rewrite(["-x", "cuda", "-c", "kernels.cpp"], toolkit)
    assert out == [*compat.compile_flags(), *RECIPE, "--cuda-gpu-arch=sm_90", "-x", "cuda", "-c", "kernels.cpp"]
    out, _, _ = _rewrite(["-xcuda", "-c", "kernels.cpp"], toolkit)
    assert "--cuda-gpu-arch=sm_90" in out
    out, _, _ = _rewrite(["-x", "cuda", "-x", "none", "-c", "main.cpp"], toolkit)
    assert out == ["-x", "cuda", "-x", "none", "-c", "main.cpp"]


def test_an_architecture_the_user_gives_is_the_only_one(toolkit):
    for arch in (["--cuda-gpu-arch=sm_80"], ["--offload-arch=sm_80,sm_90"]):
        out, _, _ = _rewrite([*arch, "-c", "app.cu"], toolkit)
        assert not [a for a in out if a.startswith("--cuda-gpu-arch=") and a not in arch]
    out, _, _ = _rewrite(["-c", "app.cu"], toolkit, {"PROTEUS_CUDA_ARCH": "80,sm_90a"})
    assert [a for a in out if a.startswith("--cuda-gpu-arch=")] == ["--cuda-gpu-arch=sm_80", "--cuda-gpu-arch=sm_90a"]


def test_the_users_fp_contract_comes_last_and_so_wins(toolkit):
    out, _, _ = _rewrite(["-c", "app.cu", "-ffp-contract=fast"], toolkit)
    assert [a for a in out if a.startswith("-ffp-contract")] == ["-ffp-contract=on", "-ffp-contract=fast"]


def test_a_bitcode_flag_the_user_gives_is_not_doubled(toolkit):
    for flags in (["-fembed-bitcode"], ["-Xclang", "-fembed-bitcode=all"]):
        out, _, _ = _rewrite([*flags, "-c", "app.cu"], toolkit)
        assert out.count("-fembed-bitcode=all") + out.count("-fembed-bitcode") == 1


def test_plain_cpp_is_untouched_and_asks_for_no_toolkit(toolkit):
    for args in (["-O2", "-c", "main.cpp", "-o", "main.o"], ["-O2", "main.cpp", "-o", "main"], ["-E", "main.cpp"],
                 ["-M", "main.cc"], ["--version"], ["-v"], ["-###", "main.cpp"], ["-print-search-dirs"],
                 ["--version", "app.cu"]):
        out, _, asked = _rewrite(args, toolkit)
        assert out == args and asked == [], args


def test_preprocessing_cuda_gets_only_what_finds_its_headers(toolkit):
    for mode in ("-E", "-M", "-MM"):
        out, compat, _ = _rewrite([mode, "app.cu"], toolkit)
        assert out == [*compat.compile_flags(), "--cuda-gpu-arch=sm_90", mode, "app.cu"]


def test_separate_values_are_no_inputs(toolkit):
    out, _, _ = _rewrite(["-c", "main.cpp", "-MF", "x.cu", "-MT", "y.cu", "-o", "main.o"], toolkit)
    assert out == ["-c", "main.cpp", "-MF", "x.cu", "-MT", "y.cu", "-o", "main.o"]


def test_a_response_file_is_read_and_passed_on(toolkit, tmp_path):
    rsp = tmp_path / "args.rsp"
    rsp.write_text("-c app.cu -o 'app dir/app.o'\n")
    out, compat, _ = _rewrite([f"@{rsp}"], toolkit)
    assert out == [*compat.compile_flags(), *RECIPE, "--cuda-gpu-arch=sm_90", f"@{rsp}"]


def test_a_cuda_path_the_user_gives_names_the_toolkit_to_wrap(toolkit):
    """CMake passes the toolkit it found as --cuda-path: the wrapper puts its compat tree there."""
    out, compat, asked = _rewrite(["--cuda-path=/opt/cuda", "-c", "app.cu"], toolkit)
    assert asked == ["/opt/cuda"]
    assert [a for a in out if a.startswith("--cuda-path=")] == ["--cuda-path=/compat/cuda"]


# ------------------------------------------------------------------ the compat tree

def test_the_compat_tree_mirrors_the_toolkit_and_its_fatbinary_speaks_cuda_13(toolkit, tmp_path):
    compat = cc.compat_tree(toolkit, tmp_path / "cache")
    assert compat.cuda == toolkit.resolve()
    for entry in ("include", "lib64", "nvvm", "bin/nvcc", "bin/nvcc.profile", "bin/ptxas"):
        assert (compat.root / entry).resolve() == (toolkit / entry).resolve(), entry
    fatbinary = compat.root / "bin" / "fatbinary"
    assert not fatbinary.is_symlink() and fatbinary.read_text().startswith("#!/bin/sh\n")
    proc = subprocess.run([str(fatbinary), "-64", "--create", "/o/x.fatbin", "--image=profile=sm_90a,file=/t/a b.cubin",
                           "--image=profile=compute_90,file=/t/a.s", "--compress-mode=speed"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines() == ["-64", "--create", "/o/x.fatbin", "--image3=kind=elf,sm=90a,file=/t/a b.cubin",
                                        "--image3=kind=ptx,sm=90,file=/t/a.s", "--compress-mode=speed"]
    # stand-ins only for what the toolkit lacks: a real header is never hidden
    assert sorted(p.name for p in compat.stubs.iterdir()) == ["curand_mtgp32_kernel.h", "texture_fetch_functions.h"]
    assert cc.find_cuda(compat.root, {}) == toolkit.resolve()  # a compat tree given back names its toolkit


def test_an_older_toolkit_keeps_its_own_fatbinary(toolkit, tmp_path):
    (toolkit / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    compat = cc.compat_tree(toolkit, tmp_path / "cache")
    assert (compat.root / "bin" / "fatbinary").resolve() == (toolkit / "bin" / "fatbinary").resolve()


def test_parallel_builds_share_one_complete_tree(toolkit, tmp_path):
    cache = tmp_path / "cache"
    code = f"from proteus_rewrite import cc; print(cc.compat_tree({str(toolkit)!r}, {str(cache)!r}).root)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(8)]
    results = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    roots = {out.strip() for out, _ in results}
    assert len(roots) == 1
    assert os.listdir(cache) == [Path(roots.pop()).parent.name]  # no temporary directory left behind


def test_a_cache_that_cannot_be_written_is_one_line_naming_the_fix(toolkit, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(cc.SetupError, match=r"^cannot make the CUDA compat tree under .*; set XDG_CACHE_HOME"):
        cc.compat_tree(toolkit, tmp_path / "file" / "cache")


# ------------------------------------------------------------------ errors

def _main(monkeypatch, capsys, env, args):
    for name in ("CUDA_PATH", "PROTEUS_CLANG", "PROTEUS_CUDA_ARCH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = cc.main(args)
    return code, capsys.readouterr()


def test_no_toolkit_is_one_line_naming_the_path_and_the_fix(monkeypatch, capsys, tmp_path):
    clang = tmp_path / "clang++"
    _script(clang, "exit 0\n")
    code, out = _main(monkeypatch, capsys, {"PROTEUS_CLANG": str(clang), "CUDA_PATH": str(tmp_path / "none"),
                                            "XDG_CACHE_HOME": str(tmp_path / "cache")}, ["-c", "app.cu"])
    assert code == cc.EXIT_SETUP == 2 and out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("proteus-clang++: error: ")
    assert str(tmp_path / "none") in out.err and "CUDA_PATH" in out.err


def test_no_clang_is_one_line_naming_the_fix(monkeypatch, capsys, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    code, out = _main(monkeypatch, capsys, {"PATH": str(empty)}, ["-c", "main.cpp"])
    assert code == 2 and out.err.count("\n") == 1
    assert out.err.startswith("proteus-clang++: error: no clang 19") and "PROTEUS_CLANG" in out.err
    old = empty / "clang++"
    _script(old, 'echo "clang version 14.0.6"\n')
    code, out = _main(monkeypatch, capsys, {"PATH": str(empty)}, ["-c", "main.cpp"])
    assert code == 2 and "clang++ is version 14" in out.err


def test_proteus_show_prints_the_command_instead_of_running_it(monkeypatch, capsys, tmp_path, toolkit):
    clang = tmp_path / "clang++"
    _script(clang, "touch ran\n")
    code, out = _main(monkeypatch, capsys, {"PROTEUS_CLANG": str(clang), "CUDA_PATH": str(toolkit),
                                            "XDG_CACHE_HOME": str(tmp_path / "cache")},
                      ["--proteus-show", "-c", "app.cu", "-o", "app.o"])
    assert code == 0 and not (Path.cwd() / "ran").exists()
    words = out.out.split()
    assert words[0] == str(clang) and words[-4:] == ["-c", "app.cu", "-o", "app.o"] and "-fembed-bitcode=all" in words
    assert any(w.startswith(f"--cuda-path={tmp_path / 'cache'}") for w in words)


# ------------------------------------------------------------------ the README's build, from a pip install

def _need_toolchain() -> Path:
    cuda = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    if shutil.which(os.environ.get("PROTEUS_CLANG", "clang++-19")) is None:
        pytest.skip("needs clang++-19 (or PROTEUS_CLANG) to build CUDA programs")
    if not (cuda / "include" / "cuda_runtime.h").is_file():
        pytest.skip(f"needs the CUDA toolkit at {cuda} (CUDA_PATH)")
    return cuda


@pytest.mark.slow
def test_the_readme_build_line_works_from_a_pip_install(installed, tmp_path):  # noqa: F811
    _need_toolchain()
    for name in ("loop_count.cu", "common.h"):
        shutil.copy(ROOT / "samples" / "src" / name, tmp_path / name)
    shutil.move(tmp_path / "loop_count.cu", tmp_path / "app.cu")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROTEUS_", "PYTHON"))}
    env.update(PATH=f"{installed / 'bin'}{os.pathsep}{env.get('PATH', '')}", XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run(["proteus-clang++", "-O3", "app.cu", "-o", "app"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (installed / "bin" / "proteus-clang++").read_text().startswith(f"#!{installed}")
    # the compat tree came from the installed package, into the user's cache
    (fatbinary,) = (tmp_path / "cache" / "proteus-rewrite" / "compat").glob("*/cuda/bin/fatbinary")
    assert fatbinary.read_text().startswith("#!/bin/sh\n")
    proc = subprocess.run(["proteus-rewrite", "inspect", "--json", "app"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["app"]["cudart"] == "static" and not doc["warnings"]
    assert doc["kernels"] and all(k["has_bitcode"] for k in doc["kernels"])
    (module,) = doc["modules"]
    assert module["recipe"]["name"] == "-Xclang -fembed-bitcode=all" and module["recipe"]["fp_contract"] == "on"
    assert module["recipe"]["target_cpu"] == "sm_90"
