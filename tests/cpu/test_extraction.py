"""Extraction of every sample, checked against what its source says."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

# name -> {mangled kernel: [(kind, size), ...]} as written in samples/src/*.cu
LOOP_COUNT = {
    "_Z9axpy_loopiifPKfPf": [("int", 4), ("int", 4), ("float", 4), ("pointer", 8), ("pointer", 8)],
    "_Z9poly_evaliidbPKdS0_Pd": [("int", 4), ("int", 4), ("float", 8), ("int", 1), ("pointer", 8), ("pointer", 8), ("pointer", 8)],
    "_Z10mix_roundsyjxPy": [("int", 8), ("int", 4), ("int", 8), ("pointer", 8)],
}
TWO_TU = {
    "_Z6squarePfi": [("pointer", 8), ("int", 4)],
    "_Z9histogramPKfiPji": [("pointer", 8), ("int", 4), ("pointer", 8), ("int", 4)],
    "_Z9normalizePKjPfif": [("pointer", 8), ("pointer", 8), ("int", 4), ("float", 4)],
}
EXPECTED = {
    "loop_count": LOOP_COUNT,
    "loop_count_dynamic": LOOP_COUNT,
    "loop_count_lz4": LOOP_COUNT,
    "loop_count_uncompressed": LOOP_COUNT,
    "loop_count_zstd_all": LOOP_COUNT,
    "device_globals": {
        "_Z10accumulatePKfi": [("pointer", 8), ("int", 4)],
        "_Z5applyPfPKfi": [("pointer", 8), ("pointer", 8), ("int", 4)],
    },
    "multi_kernel": {
        "_Z4initPfiff": [("pointer", 8), ("int", 4), ("float", 4), ("float", 4)],
        "_Z5scalePfif": [("pointer", 8), ("int", 4), ("float", 4)],
        "_Z7stencilPKfPfii": [("pointer", 8), ("pointer", 8), ("int", 4), ("int", 4)],
        "_Z10block_sumsPKfPfi": [("pointer", 8), ("pointer", 8), ("int", 4)],
    },
    "two_tu": TWO_TU,
    "two_tu_rdc": TWO_TU,
    "templates": {
        "_Z9scale_addIfLi4EEvPT_PKS0_S0_i": [("pointer", 8), ("pointer", 8), ("float", 4), ("int", 4)],
        "_Z9scale_addIdLi2EEvPT_PKS0_S0_i": [("pointer", 8), ("pointer", 8), ("float", 8), ("int", 4)],
        "_Z9scale_addIiLi1EEvPT_PKS0_S0_i": [("pointer", 8), ("pointer", 8), ("int", 4), ("int", 4)],
        "_Z6affine6AffinePKfPf": [("aggregate", 24), ("pointer", 8), ("pointer", 8)],
        "_Z11bounded_sumPKfPfii": [("pointer", 8), ("pointer", 8), ("int", 4), ("int", 4)],
    },
    "annotated": {"_Z6smoothPfiif": [("pointer", 8), ("int", 4), ("int", 4), ("float", 4)]},
    "driver_api": {"scale_loop": [("pointer", 8), ("int", 4), ("int", 4), ("float", 4)],
                   "scale_plain": [("pointer", 8), ("int", 4), ("int", 4), ("float", 4)]},
    "launch_overhead": {"_Z4tinyPii": [("pointer", 8), ("int", 4)]},
}


@pytest.mark.parametrize("app", sorted(EXPECTED))
def test_every_kernel_is_recorded_with_its_parameter_kinds_and_sizes(table, app):
    t = table(app)
    got = {k.name: [(p.kind, p.size) for p in k.params] for k in t.kernels}
    assert got == EXPECTED[app]
    assert not t.warnings


@pytest.mark.parametrize("app", sorted(EXPECTED))
def test_parameter_offsets_follow_the_abi_alignment(table, app):
    for k in table(app).kernels:
        end = 0
        for p in k.params:
            assert p.offset % p.align == 0, (k.name, p)
            assert p.offset >= end
            end = p.offset + p.size
        assert k.param_size == end


@pytest.mark.parametrize("app", sorted(EXPECTED))
def test_recorded_bitcode_parses_and_defines_each_kernel(table, app):
    t = table(app)
    for k in t.kernels:
        assert k.has_bitcode
        mod = llvm.parse_bitcode(t.modules[k.module].code)
        fn = mod.get_function(k.name)
        assert not fn.is_declaration
        assert len(list(fn.arguments)) == len(k.params)
        assert t.modules[k.module].triple == "nvptx64-nvidia-cuda"


def test_driver_api_app_embeds_its_fat_binary_and_uses_a_device_global(table):
    t = table("driver_api")
    assert t.app.cudart == "none"
    globals_ = {k.demangled: k.globals for k in t.kernels}
    assert globals_ == {"scale_loop": ("bias",), "scale_plain": ()}


def test_demangled_names_of_templates(table):
    names = {k.demangled for k in table("templates").kernels}
    assert "void scale_add<float, 4>(float*, float const*, float, int)" in names
    assert "affine(Affine, float const*, float*)" in names


def test_struct_by_value_is_an_aggregate_of_its_llvm_struct_type(table):
    k = next(k for k in table("templates").kernels if k.name == "_Z6affine6AffinePKfPf")
    p = k.params[0]
    assert p.byval and p.llvm_type == "%struct.Affine" and p.size == 24 and p.align == 8


def test_launch_bounds_are_recorded(table):
    by_name = {k.name: k for k in table("templates").kernels}
    assert by_name["_Z11bounded_sumPKfPfii"].max_threads == (128, 1, 1)
    assert by_name["_Z11bounded_sumPKfPfii"].min_ctas == 4
    assert by_name["_Z6affine6AffinePKfPf"].max_threads is None


def test_device_globals_are_attributed_to_the_kernels_that_use_them(table):
    t = table("device_globals")
    for k in t.kernels:
        assert k.globals == ("coeffs", "hits", "table")


def test_shared_memory_is_not_a_device_variable(table):
    k = next(k for k in table("multi_kernel").kernels if k.name == "_Z10block_sumsPKfPfi")
    assert k.globals == ()  # extern __shared__ float buf[] stays in the JIT module


def test_jit_annotation_indices(table):
    (k,) = table("annotated").kernels
    assert k.jit_args == (2, 3)
    assert all(k.jit_args is None for k in table("loop_count").kernels)


def test_two_translation_units_give_two_fatbins_and_two_modules(table):
    t = table("two_tu")
    assert len(t.fatbins) == 2 and len(t.modules) == 2
    assert {t.modules[k.module].source_filename.rsplit("/", 1)[-1] for k in t.kernels} == {"two_tu_main.cu", "two_tu_kernels.cu"}
    assert all(k.link_modules == () for k in t.kernels)


def test_rdc_build_links_the_other_translation_units(table):
    t = table("two_tu_rdc")
    assert t.app.rdc and len(t.fatbins) == 1 and len(t.modules) == 2
    for k in t.kernels:
        assert set(k.link_modules) | {k.module} == {0, 1}


def test_multi_arch_build_records_one_variant_per_architecture(table):
    t = table("loop_count_multi_arch")
    assert sorted({k.arch for k in t.kernels}) == [80, 90]
    assert {t.modules[k.module].arch for k in t.kernels if k.arch == 80} == {80}
    assert len(t.kernels) == 6


def test_static_and_dynamic_cudart_are_told_apart(table):
    assert table("loop_count").app.cudart == "static"
    assert table("loop_count_dynamic").app.cudart == "dynamic"


def test_a_mixed_build_takes_both_routes(table):
    """One translation unit built by clang with bitcode, one by nvcc: the first's kernel keeps
    the bitcode route, the nvcc kernels take the PTX route, with their parameters typed from the
    PTX signature and the demangled name."""
    t = table("mixed_nvcc")
    assert {k.name for k in t.kernels_with_bitcode} == {"_Z6squarePfi"}
    assert {k.name: k.code for k in t.kernels} == {"_Z6squarePfi": "bitcode", "_Z9histogramPKfiPji": "ptx",
                                                   "_Z9normalizePKjPfif": "ptx"}
    assert not t.warnings
    hist = next(k for k in t.kernels if k.name == "_Z9histogramPKfiPji")
    assert t.modules[hist.module].kind == "ptx"
    assert [(p.kind, p.llvm_type, p.size, p.offset) for p in hist.params] == [
        ("pointer", None, 8, 0), ("int", "i32", 4, 8), ("pointer", None, 8, 16), ("int", "i32", 4, 24)]


def test_an_nvcc_build_takes_the_ptx_route(table):
    t = table("loop_count_nvcc")
    assert {k.name for k in t.kernels} == set(LOOP_COUNT)
    assert not t.kernels_with_bitcode
    assert {k.code for k in t.kernels_specializable} == {"ptx"} and len(t.kernels_specializable) == len(t.kernels)
    (module,) = t.modules
    assert module.kind == "ptx" and module.code.lstrip().startswith(b"//") or b".version" in module.code
    mix = next(k for k in t.kernels if k.demangled.startswith("mix_rounds"))
    # unsigned long long and long long are integers; the last, a pointer, is never folded
    assert [(p.kind, p.llvm_type) for p in mix.params] == [("int", "i64"), ("int", "i32"), ("int", "i64"), ("pointer", None)]


def test_upstreams_json_annotations_name_the_arguments_to_fold(tmp_path):
    """annotate("jit", R"({"arg":1})", ...), as upstream's kernel_args_annot_* tests write it,
    alone and mixed with plain indices; arrays and objects (a "type" other than a scalar's) are
    not folded here."""
    from proteus_rewrite.fatbin.kernels import extract

    from ..support.clang import build_cuda

    src = tmp_path / "annot.cu"
    src.write_text('''#include <cstdio>
__global__ __attribute__((annotate("jit", R"({"arg":1})", 2, R"({"arg":3,"type":3})", R"({"arg":4,"type":12})")))
void k(int a, int b, int c, int *d) { if (a + b + c) d[0] = a; }
int main() { int *d; cudaMalloc(&d, 4); k<<<1, 1>>>(1, 2, 3, d); cudaDeviceSynchronize(); return 0; }
''')
    (k,) = extract(build_cuda([src], tmp_path / "annot")).kernels
    assert k.jit_args == (1, 2, 3)
