"""The build recipe: the recommended one (-Xclang -fembed-bitcode=all) gives a real sm_90 AOT
build with its module embedded before optimization; clang's -fembed-bitcode gives sm_30 PTX and
an optimized module, and gets one warning naming the fix. Both are specialized."""

from __future__ import annotations

import json

import pytest

from proteus_rewrite.fatbin import container, extract, hostelf, recipe
from proteus_rewrite.fatbin import ptx as ptx_mod
from proteus_rewrite.fatbin.entry import Kind
from proteus_rewrite.jit import Config, Launch, pipeline, specializer
from proteus_rewrite.jit.launch import parse_value
from samples import build as samples_build

from ..conftest import run_cli
from ..support.clang import build_cuda


def _aot_ptx_targets(path) -> set[str]:
    elf = hostelf.parse(open(path, "rb").read())
    out = set()
    for cont in container.parse_section(elf.sections[hostelf.CUDA_FATBIN].data):
        for e in cont.entries:
            if e.kind == Kind.PTX:
                out.add(ptx_mod.parse(e.payload()).target)
    return out


def test_the_samples_build_with_the_recipe_the_tool_recommends():
    assert samples_build.RECIPES["recommended"] == recipe.RECOMMENDED_FLAGS


def test_a_shuffle_sample_built_as_recommended_is_a_real_sm_90_build_and_specializes(samples):
    assert _aot_ptx_targets(samples / "warp_reduce") == {"sm_90"}
    table = extract(samples / "warp_reduce")
    assert not table.warnings
    (module,) = table.modules
    assert (module.recipe.name, module.recipe.embedded, module.recipe.target_cpu) == (
        "-Xclang -fembed-bitcode=all", "before optimization", "sm_90")
    for k in table.kernels:
        assert not k.globals  # clang's threadIdx/blockDim objects are no device variables
        raw = tuple(parse_value(p, "4") if p.kind == "int" else parse_value(p, "0.75") if p.kind == "float"
                    else bytes(p.size) for p in k.params)
        pointers = frozenset(p.index for p in k.params if p.kind == "pointer")
        result = specializer.specialize(table, k, Launch(raw, (4096, 1, 1), (256, 1, 1), 90, {}, pointers),
                                        Config.from_env({"PROTEUS_COMPILE_PROCESS": "0"}), driver_version=13000)
        assert "shfl.sync.bfly.b32" in result.ptx.text and ".target sm_90" in result.ptx.text


def test_the_old_recipe_cannot_build_shuffles(tmp_path, samples):
    with pytest.raises(AssertionError, match="Cannot select: intrinsic %llvm.nvvm.shfl.sync"):
        build_cuda([samples.parent / "src" / "warp_reduce.cu"], tmp_path / "w", "fembed-bitcode",
                   includes=(samples.parent / "src",))


def test_an_old_recipe_binary_gets_one_warning_naming_the_fix_and_still_specializes(samples, tmp_path):
    assert _aot_ptx_targets(samples / "loop_count_fembed") == {"sm_30"}
    proc = run_cli("inspect", str(samples / "loop_count_fembed"), "--json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    (module,) = doc["modules"]
    assert module["recipe"]["name"] == "-fembed-bitcode" and module["recipe"]["embedded"] == "after optimization"
    assert module["ptx_target"] == "sm_30"
    (warning,) = doc["warnings"]
    assert "sm_30" in warning and recipe.RECOMMENDED in warning
    rewrite = run_cli(str(samples / "loop_count_fembed"), "-o", str(tmp_path))
    assert rewrite.returncode == 0 and rewrite.stderr.count("-Xclang -fembed-bitcode=all") == 1
    clean = run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "new"))
    assert clean.returncode == 0 and "warning" not in clean.stderr
    table = extract(samples / "loop_count_fembed")
    k = next(k for k in table.kernels if k.demangled.startswith("axpy_loop"))
    raw = tuple(parse_value(p, "8") if p.kind == "int" else parse_value(p, "0.5") if p.kind == "float"
                else bytes(p.size) for p in k.params)
    result = specializer.specialize(table, k, Launch(raw, (64, 1, 1), (256, 1, 1), 90, {}, frozenset({3, 4})),
                                    Config.from_env({"PROTEUS_COMPILE_PROCESS": "0"}), driver_version=13000)
    assert ".target sm_90" in result.ptx.text


@pytest.mark.parametrize("cmdline, expected", [
    (["-cc1", "-triple", "nvptx64-nvidia-cuda", "-target-cpu", "sm_90", "-O3", "-fembed-bitcode=all"],
     ("-Xclang -fembed-bitcode=all", "before optimization", "sm_90", "3", None)),
    (["-cc1", "-triple", "nvptx64-nvidia-cuda", "-fembed-bitcode=all", "-disable-llvm-passes", "-O3"],
     ("-fembed-bitcode", "after optimization", None, "3",
      "its device code was compiled without a GPU target (clang's -fembed-bitcode drops -target-cpu)")),
    (["-cc1", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", "gfx90a", "-emit-obj", "-fembed-bitcode=all",
      "-disable-llvm-passes"], ("two-step", "after optimization", "gfx90a", None, None)),
    ([], ("unknown", "unknown", None, None, None)),
])
def test_the_recipe_is_read_from_the_recorded_command_line(cmdline, expected):
    r = recipe.classify(cmdline)
    assert (r.name, r.embedded, r.target_cpu, r.opt_level, r.problem) == expected


@pytest.mark.parametrize("flags, contract", [([], "fast"), (["-ffp-contract=fast-honor-pragmas"], "fast"),
                                             (["-ffp-contract=on"], "on"), (["-ffp-contract=fast", "-ffp-contract=off"], "off")])
def test_the_recipe_says_how_floating_point_was_contracted(flags, contract):
    """clang's CUDA default puts no flag on the line and means fast: the one that lets a
    variant round differently (docs/user/build.md)."""
    assert recipe.classify(["-cc1", "-triple", "nvptx64-nvidia-cuda", "-target-cpu", "sm_90", *flags]).fp_contract == contract


def test_the_pipeline_takes_the_aot_compiles_tuning():
    """clang -O3 vectorizes with SLP as well as loops (LLVM's own default leaves SLP off)."""
    pre = pipeline.Tuning.from_cmdline(["-cc1", "-O3", "-vectorize-loops", "-vectorize-slp"])
    assert (pre.loop_vectorization, pre.slp_vectorization, pre.loop_unrolling) == (True, True, True)
    assert not pipeline.Tuning.from_cmdline(["-cc1", "-O3", "-fno-unroll-loops"]).slp_vectorization
    assert not pipeline.Tuning.from_cmdline(["-cc1", "-O3", "-fno-unroll-loops"]).loop_unrolling
    post = pipeline.Tuning.from_cmdline(["-cc1", "-disable-llvm-passes", "-O1"])
    assert (post.loop_vectorization, post.slp_vectorization) == (False, False)
    assert pipeline.Tuning.from_cmdline(["-cc1", "-disable-llvm-passes", "-O3"]).slp_vectorization
