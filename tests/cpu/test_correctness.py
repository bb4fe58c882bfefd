"""A specialized variant computes what the recorded code computes: real programs' kernels,
specialized as the run time would, executed on the CPU (tests/support/nvptx_cpu.py) against
the recorded module itself; and kernels the wrapper technique must accept as they are."""

from __future__ import annotations

from pathlib import Path

import llvmlite.binding as llvm
import pytest

from proteus_rewrite.fatbin import extract
from proteus_rewrite.jit import Config, Launch, specializer
from proteus_rewrite.jit.ir import define_undefined
from proteus_rewrite.jit.launch import parse_value

from ..support import nvptx_cpu
from ..support.clang import build_cuda

DATA = Path(__file__).resolve().parents[1] / "data" / "hecbench"

# HeCBench wsm5's launch (main.cu): delt, then the 18 domain, memory and patch bounds
WSM5_VALUES = {15: "10.0", **{16 + i: v for i, v in enumerate(["1", "60", "1", "46", "1", "3"] * 3)}}
WSM5_SCALARS = [10.0] + [1, 60, 1, 46, 1, 3] * 3
WSM5_GRID, WSM5_BLOCK = (8, 6, 1), (8, 8, 1)
D3, D2 = 60 * 46 * 3, 60 * 46


def _build_wsm5(tmp_path_factory, recipe: str):
    exe = build_cuda([DATA / "wsm5" / "main.cu"], tmp_path_factory.mktemp("wsm5") / "main", recipe,
                     flags=("-DMKX=4",), includes=(DATA / "wsm5",))
    table = extract(exe)
    return table, next(k for k in table.kernels if k.demangled.startswith("wsm("))


@pytest.fixture(scope="module", params=["recommended", "fembed-bitcode"])
def wsm5(request, tmp_path_factory):
    return _build_wsm5(tmp_path_factory, request.param)


def _first_column_rain(ir_text: str, name: str) -> float:
    """The kernel run for the first column only (every column's inputs are alike: 0.001)."""
    kernel = nvptx_cpu.compile_kernel(ir_text, name)
    arrays = [nvptx_cpu.floats([0.001] * D3) for _ in range(10)] + [nvptx_cpu.floats([0.001] * D2) for _ in range(5)]
    kernel.launch(WSM5_GRID, WSM5_BLOCK, arrays + WSM5_SCALARS, threads=1)
    return arrays[10][0]


def test_wsm5_variant_with_its_launch_values_folded_computes_what_the_recorded_code_does(wsm5):
    """The kernel reads two accumulators before writing them (undefined behaviour). The program
    prints rain = 2.759990 natively, 1295467.875 from a variant before the JIT defined such
    reads as zero: LLVM 22 picked another value for them than clang 19 had."""
    table, k = wsm5
    recorded = str(llvm.parse_bitcode(table.modules[k.module].code))
    expected = _first_column_rain(recorded, k.name)
    assert expected == pytest.approx(0.001, rel=1e-4)  # 2,760 columns: the native checksum 2.759990
    raw = tuple(parse_value(p, WSM5_VALUES[p.index]) if p.index in WSM5_VALUES else bytes(p.size) for p in k.params)
    unknown = frozenset(i for i in range(len(k.params)) if i not in WSM5_VALUES)
    result = specializer.specialize(table, k, Launch(raw, WSM5_GRID, WSM5_BLOCK, 90, {}, unknown),
                                    Config.from_env({"PROTEUS_COMPILE_PROCESS": "0"}), keep_ir=True,
                                    driver_version=13000)
    assert set(result.folded) == set(WSM5_VALUES)
    assert _first_column_rain(result.ir_text, result.entry) == pytest.approx(expected, rel=1e-5)
    assert any("undefined value" in n for n in result.notes), result.notes


def test_undefined_operands_become_zero_and_shuffle_masks_stay():
    text = ("define void @f(float %a, <2 x float> %v) {\n"
            "b:\n  %p = phi float [ undef, %b ], [ poison, %c ]\n"
            "  %s = shufflevector <2 x float> %v, <2 x float> poison, <2 x i32> <i32 1, i32 poison>\n"
            "  %n = call float @g(float noundef %a)\n  ret void\n}\n"
            "@x = global float undef\n")
    out, count = define_undefined(text)
    assert count == 2 and "[ zeroinitializer, %b ], [ zeroinitializer, %c ]" in out
    assert "<2 x float> poison, <2 x i32> <i32 1, i32 poison>" in out  # a mask's undefined lane selects nothing
    assert "noundef" in out and "@x = global float undef" in out  # attributes and global initializers untouched


NOINLINE_DAXPY = r"""
#include <cstdio>
// upstream Proteus tests/gpu/daxpy.cpp declares its kernel so
__global__ __attribute__((annotate("jit", 4), noinline)) void daxpyImpl(double A, double *a, double *b, size_t N) {
  size_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (size_t i = tid; i < N; i += blockDim.x * gridDim.x) b[i] = A * a[i] + b[i];
}
int main() { double *a = nullptr; daxpyImpl<<<1, 256>>>(2.0, a, a, 0); return 0; }
"""

FTZ = r"""
__global__ void scale(float *x, float f, int n) { for (int i = 0; i < n; ++i) x[i] = x[i] * f + 1.0f; }
int main() { scale<<<1, 1>>>(nullptr, 0.5f, 0); return 0; }
"""


@pytest.mark.parametrize("recipe", ["recommended", "fembed-bitcode"])
def test_a_noinline_kernel_is_specialized_and_verifies(tmp_path, recipe):
    src = tmp_path / "daxpy.cu"
    src.write_text(NOINLINE_DAXPY)
    table = extract(build_cuda([src], tmp_path / "daxpy", recipe))
    k = table.kernels[0]
    raw = (parse_value(k.params[0], "2.0"), bytes(8), bytes(8), parse_value(k.params[3], "4096"))
    result = specializer.specialize(table, k, Launch(raw, (1, 1, 1), (256, 1, 1), 90, {}, frozenset({0, 1, 2})),
                                    Config.from_env({"PROTEUS_COMPILE_PROCESS": "0"}), keep_ir=True,
                                    driver_version=13000)
    assert result.folded == {3: 4096}  # annotate("jit", 4): the 1-based fourth argument only
    (entry,) = [line for line in result.ir_text.splitlines() if line.startswith("define") and f'@"{result.entry}"(' in line]
    assert "noinline" not in entry
    assert result.ptx.text.count(".entry") == 1


def test_the_wrapper_keeps_the_kernels_floating_point_mode(tmp_path):
    """-fcuda-flush-denormals-to-zero reaches code generation as a function attribute of the
    kernel, which the new kernel must carry: else the variant computes with denormals."""
    src = tmp_path / "ftz.cu"
    src.write_text(FTZ)
    table = extract(build_cuda([src], tmp_path / "ftz", flags=("-fcuda-flush-denormals-to-zero",)))
    k = table.kernels[0]
    raw = (bytes(8), parse_value(k.params[1], "0.5"), parse_value(k.params[2], "64"))
    result = specializer.specialize(table, k, Launch(raw, (1, 1, 1), (1, 1, 1), 90, {}, frozenset({0})),
                                    Config.from_env({"PROTEUS_COMPILE_PROCESS": "0"}), keep_ir=True,
                                    driver_version=13000)
    assert '"denormal-fp-math-f32"="preserve-sign' in result.ir_text
    assert ".ftz.f32" in result.ptx.text


def test_a_variant_contracts_floating_point_operations_as_the_aot_compile_did(tmp_path_factory):
    """clang's CUDA default -ffp-contract=fast lets its backend fuse any mul/add and leaves
    `mul.f32` for ptxas to fuse as well; only operations the program rounds on purpose keep
    `.rn`. Generated with LLVM's default (Standard) fusion, the variant had 66 `mul.rn` where
    the AOT PTX has 7: the same kernel, rounded differently."""
    table, k = _build_wsm5(tmp_path_factory, "recommended")  # (-fembed-bitcode's AOT PTX had no target, no fusion)
    raw = tuple(bytes(p.size) for p in k.params)
    result = specializer.specialize(table, k, Launch(raw, WSM5_GRID, WSM5_BLOCK, 90, {}, frozenset(range(len(k.params)))),
                                    Config.from_env({"PROTEUS_COMPILE_PROCESS": "0", "PROTEUS_SPECIALIZE_ARGS": "0",
                                                     "PROTEUS_SPECIALIZE_DIMS": "0", "PROTEUS_CAP_REGISTERS": "0",
                                                     "PROTEUS_SPECIALIZE_LAUNCH_BOUNDS": "0"}), driver_version=13000)
    # LLVM 22 writes some of clang 19's add.rn of a negated value as sub.rn: the same roundings
    ours, aot = _rn_ops(result.ptx.text), _rn_ops(_aot_ptx(table.app.path))
    assert sum(ours.values()) == sum(aot.values()) and ours["mul"] == aot["mul"], (ours, aot)


def _aot_ptx(path) -> str:
    from proteus_rewrite.fatbin import container, hostelf
    from proteus_rewrite.fatbin.entry import Kind

    elf = hostelf.parse(open(path, "rb").read())
    return "".join(e.payload().decode(errors="replace") for c in container.parse_section(elf.sections[hostelf.CUDA_FATBIN].data)
                   for e in c.entries if e.kind == Kind.PTX)


def _rn_ops(ptx: str) -> dict[str, int]:
    import re

    ops = re.findall(r"\b(mul|add|sub)\.rn\.f(?:32|64)", ptx)
    return {op: ops.count(op) for op in sorted(set(ops))}
