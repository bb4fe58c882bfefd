"""The PTX code kind on real nvcc output: what the rewrite does to the text, and that ptxas
assembles every variant (the GPU tests run them)."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest

from proteus_rewrite.errors import SpecializeError
from proteus_rewrite.jit import ptx_route, specializer
from proteus_rewrite.jit.config import Config
from proteus_rewrite.jit.launch import Launch
from proteus_rewrite.jit.plan import Findings

PTXAS = Path("/usr/local/cuda/bin/ptxas")
needs_ptxas = pytest.mark.skipif(not PTXAS.exists() and shutil.which("ptxas") is None, reason="no ptxas")


def _launch(k, values=None, block=(256, 1, 1), grid=(40, 1, 1)):
    values = values or {}
    args = []
    for p in k.params:
        if p.index in values:
            args.append(values[p.index])
        elif p.kind == "pointer":
            args.append((0x7F0000001000 + 256 * p.index).to_bytes(8, "little"))
        elif p.llvm_type == "float":
            args.append(struct.pack("<f", 2.5))
        elif p.llvm_type == "double":
            args.append(struct.pack("<d", 0.25))
        else:
            args.append(bytes((3 + p.index + i) % 256 for i in range(p.size)))
    globals_ = {n: 0x7F0000100000 + 4096 * i for i, n in enumerate(k.globals)}
    return Launch(tuple(args), grid, block, 90, globals_)


def _kernel(t, name):
    return next(k for k in t.kernels if k.demangled.split("(")[0].split(" ")[-1].split("<")[0] == name)


def _text(t, k, launch, env=None):
    cg = Config.from_env(env or {}).for_record(k)
    plan = specializer.make_plan(k, launch, cg)
    plan = specializer.targets.target_for(90).named(plan, k.name, "0" * 64)
    found = Findings()
    return ptx_route.specialize_text(t, k, plan, found), plan, found


def test_scalars_become_movs_of_the_launch_bytes(table):
    t = table("loop_count_nvcc")
    k = _kernel(t, "axpy_loop")
    launch = _launch(k, {0: (1000).to_bytes(4, "little"), 1: (8).to_bytes(4, "little"), 2: struct.pack("<f", 1.5)})
    text, plan, found = _text(t, k, launch)
    # the float stays a load: a product of two folded floats would be rounded where the AOT
    # code fused it into an add
    assert sorted(plan.folded) == [0, 1]
    assert "mov.b32 %r9, 0x3E8;" in text and "mov.b32 %r8, 0x8;" in text
    assert re.search(r"ld\.param\.f32 %f10, \[_Z9axpy_loopiifPKfPf_param_2\]", text)
    # the pointers are read from the launch's own parameter buffer, as before
    assert re.search(r"ld\.param\.u64 %rd\d+, \[_Z9axpy_loopiifPKfPf_param_3\]", text)
    # the signature is unchanged: the same parameter buffer serves the variant
    assert text.count("_Z9axpy_loopiifPKfPf_param_") >= 5
    assert f".entry {plan.entry}(" in text and "mix_rounds" not in text and "poly_eval" not in text
    assert "mov.u32 %r10, 256;" in text and found.sreg_calls["llvm.nvvm.read.ptx.sreg.ntid.x"] == 1
    assert ".reqntid 256, 1, 1" in text


def test_sub_word_and_sign_extended_loads(table):
    t = table("loop_count_nvcc")
    k = _kernel(t, "poly_eval")
    launch = _launch(k, {3: b"\xff"})  # bool true read as .s8 into a 16-bit register: sign-extended
    text, _plan, _found = _text(t, k, launch)
    assert re.search(r"mov\.b16 %rs1, 0xFFFF;", text)
    k = _kernel(t, "mix_rounds")
    launch = _launch(k, {2: (-5).to_bytes(8, "little", signed=True)})
    text, _plan, _found = _text(t, k, launch)
    assert "0xFFFFFFFFFFFFFFFB" in text


def test_a_by_value_struct_is_folded_piece_by_piece(table):
    t = table("templates_nvcc")
    k = _kernel(t, "affine")
    assert k.params[0].kind == "aggregate" and k.params[0].size == 24
    raw = struct.pack("<ffiid", 1.5, 2.0, 7, -3, 0.125)  # Affine {scale, shift, n, stride, bias}
    text, plan, _found = _text(t, k, _launch(k, {0: raw}))
    assert 0 in plan.folded
    # .v2.u32 at +8 folded, each element from its own bytes; .v2.f32 at +0 and .f64 at +16 stay loads
    assert "0x7;" in text and "0xFFFFFFFD;" in text
    assert not re.search(r"ld\.param\.v2\.u32[^\n]*_param_0", text)
    assert re.search(r"ld\.param\.v2\.f32[^\n]*_param_0\]", text) and re.search(r"ld\.param\.f64[^\n]*_param_0\+16\]", text)


def test_device_variables_are_reached_through_pointers(table):
    t = table("device_globals_nvcc")
    k = _kernel(t, "apply")
    assert set(k.globals) == {"hits", "table", "coeffs"}
    text, plan, _found = _text(t, k, _launch(k))
    assert sorted(plan.globals) == ["coeffs", "hits", "table"]
    # no copy of the variables in the variant; a __constant__ is read from global memory
    assert not re.search(r"\.(?:global|const)\s[^\n]*\b(?:hits|table|coeffs)\b", text)
    assert "ld.const" not in text and "[%pgv0+4]" in text
    assert text.count("__proteus_gvar_") >= 6


@needs_ptxas
@pytest.mark.parametrize("app", ["loop_count_nvcc", "templates_nvcc", "device_globals_nvcc", "multi_kernel_nvcc",
                                 "warp_reduce_nvcc", "mixed_nvcc"])
def test_every_kernel_assembles(table, app, monkeypatch):
    monkeypatch.setenv("PROTEUS_PTX_COMPILER", "ptxas")
    t = table(app)
    done = 0
    for k in t.kernels:
        if k.code != "ptx":
            continue
        block = k.max_threads or (128, 1, 1)
        r = specializer.specialize(t, k, _launch(k, block=block), Config.from_env())
        assert r.image.data[:4] == b"\x7fELF" and r.entry in r.ptx.text
        done += 1
    assert done


def test_a_parameter_whose_address_is_taken_is_not_folded(table):
    t = table("loop_count_nvcc")
    k = _kernel(t, "axpy_loop")
    module = t.modules[k.module]
    name = f"{k.name}_param_0"
    addressed = module.code.replace(f"ld.param.u32 %r9, [{name}];".encode(),
                                    f"mov.u64 %rd9, {name};\nld.param.u32 %r9, [%rd9];".encode())
    from proteus_rewrite.fatbin import ptx

    info = ptx.analyze(addressed)[k.name]
    assert info.params[0].addressed and info.kinds[0] == ("other", None)
    assert not info.params[1].addressed and info.kinds[1] == ("int", "i32")


def test_an_unknown_device_variable_address_falls_back(table):
    t = table("device_globals_nvcc")
    k = _kernel(t, "accumulate")
    launch = _launch(k)
    launch = Launch(launch.args, launch.grid, launch.block, 90, {})
    with pytest.raises(SpecializeError, match="address of device variable"):
        _text(t, k, launch)


def test_a_ptx_kernel_has_its_own_cache_key(table):
    t = table("loop_count_nvcc")
    k = _kernel(t, "axpy_loop")
    cg = Config.from_env({}).for_record(k)
    plan = specializer.make_plan(k, _launch(k), cg)
    key = specializer.cache_key(t, k, plan, cg, ("driver", 90), 90)
    other = specializer.make_plan(k, _launch(k, {1: (9).to_bytes(4, "little")}), cg)
    assert key != specializer.cache_key(t, k, other, cg, ("driver", 90), 90)
    assert not cg.specialize_alignment and not plan.alignment


FMA_PTX = """.version 9.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p)
{
.reg .f32 %f<8>;
.reg .b32 %r<4>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [p];
cvta.to.global.u64 %rd2, %rd1;
mov.b32 %r1, 0x7;
cvt.rn.f32.s32 %f1, %r1;
mov.f32 %f2, 0f3F99999A;
ld.global.f32 %f5, [%rd2];
mul.f32 %f3, %f1, %f2;
sub.f32 %f4, %f5, %f3;
mul.f32 %f6, %f5, %f2;
add.f32 %f7, %f6, %f4;
st.global.f32 [%rd2], %f7;
ret;
}
"""


def _sass(ptx_text: str, tmp_path) -> str:
    import subprocess

    src, cubin = tmp_path / "k.ptx", tmp_path / "k.cubin"
    src.write_text(ptx_text)
    subprocess.run([str(PTXAS), "-arch=sm_90", "-O3", str(src), "-o", str(cubin)], check=True)
    return cubin.read_bytes().hex()


def test_a_product_of_constants_stays_fused_into_its_subtract():
    """7.0 * 1.2f - x: a constant product (7 from a folded integer) that the AOT code, which did
    not know it, fused into the subtract. ptxas would round it at compile time; written as
    fma.rn(-7.0, 1.2f, x) it keeps the AOT code's one rounding. A product of a constant and a
    loaded value is left to ptxas, as it was."""
    from proteus_rewrite.jit import ptx_contract

    body = FMA_PTX[FMA_PTX.index("{") + 1 : FMA_PTX.rindex("}")]
    out, n = ptx_contract.keep_contraction(body)
    assert n == 1
    assert re.search(r"neg\.f32 %pfc0, %f1; fma\.rn\.f32 %f4, %pfc0, %f2, %f5;", out)
    assert "mul.f32 %f6, %f5, %f2;" in out and "add.f32 %f7, %f6, %f4;" in out


def test_a_product_with_two_uses_or_a_rounding_mode_is_left_alone():
    from proteus_rewrite.jit import ptx_contract

    body = FMA_PTX[FMA_PTX.index("{") + 1 : FMA_PTX.rindex("}")]
    twice = body.replace("st.global.f32 [%rd2], %f7;", "st.global.f32 [%rd2], %f7;\nst.global.f32 [%rd2+4], %f3;")
    assert ptx_contract.keep_contraction(twice)[1] == 0
    rounded = body.replace("mul.f32 %f3,", "mul.rn.f32 %f3,")
    assert ptx_contract.keep_contraction(rounded)[1] == 0
    redefined = body.replace("ld.global.f32 %f5, [%rd2];", "ld.global.f32 %f5, [%rd2];\nmov.f32 %f2, %f5;")
    assert ptx_contract.keep_contraction(redefined)[1] == 0


def _rewrite_body(ptx: str, rewrite) -> tuple[str, int]:
    """`ptx` with its one function's body rewritten, and the rewrite's count."""
    head, rest = ptx.split("{", 1)
    body, tail = rest.rsplit("}", 1)
    out, n = rewrite(body)
    return head + "{" + out + "}" + tail, n


@needs_ptxas
def test_ptxas_assembles_the_kept_contraction(tmp_path):
    from proteus_rewrite.jit import ptx_contract

    text, n = _rewrite_body(FMA_PTX, ptx_contract.keep_contraction)
    assert n == 1 and _sass(text, tmp_path)


@needs_ptxas
def test_ptx_newer_than_the_assembler_is_refused_with_the_fix(table, monkeypatch):
    import dataclasses

    monkeypatch.setenv("PROTEUS_PTX_COMPILER", "ptxas")
    t = table("loop_count_nvcc")
    k = _kernel(t, "axpy_loop")
    newer = t.modules[k.module].code.replace(b".version 9.0", b".version 9.9")
    t = dataclasses.replace(t, modules=(dataclasses.replace(t.modules[k.module], code=newer),))
    cg = Config.from_env().for_record(k)
    plan = specializer.make_plan(k, _launch(k), cg)
    with pytest.raises(SpecializeError, match=r"ISA 9\.9, newer than this run's assembler reads .*install a newer"):
        ptx_route.assemble(t, k, plan, cg, 90, 90, {})


def test_the_specialize_command_says_why_a_float_is_not_folded_on_the_ptx_route(samples, tmp_path):
    from ..conftest import run_cli

    assert run_cli(str(samples / "loop_count_nvcc"), "-o", str(tmp_path)).returncode == 0
    proc = run_cli("specialize", str(tmp_path / "loop_count_nvcc.kstore"), "axpy_loop", "--arg", "2=1.5")
    assert proc.returncode == 2 and "floating-point arguments are not folded" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_product_of_constants_used_by_two_adds_is_fused_into_both():
    """ptxas fuses a product into every use when all are adds or subtracts (checked in SASS:
    two FFMAs), so both uses keep the AOT code's single rounding."""
    from proteus_rewrite.jit import ptx_contract

    body = FMA_PTX[FMA_PTX.index("{") + 1 : FMA_PTX.rindex("}")]
    both = body.replace("mul.f32 %f6, %f5, %f2;", "add.f32 %f6, %f3, %f5;")
    out, n = ptx_contract.keep_contraction(both)
    assert n == 2
    assert "fma.rn.f32 %f6, %f1, %f2, %f5;" in out and "fma.rn.f32 %f4, %pfc" in out


APPROX_PTX = """.version 9.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 n)
{
.reg .f32 %f<8>;
.reg .f64 %fd<4>;
.reg .b32 %r<4>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [p];
cvta.to.global.u64 %rd2, %rd1;
mov.b32 %r1, 0x3;
cvt.rn.f32.s32 %f1, %r1;
ex2.approx.ftz.f32 %f2, %f1;
rcp.approx.ftz.f32 %f3, %f1;
ld.global.f32 %f4, [%rd2];
ex2.approx.ftz.f32 %f5, %f4;
cvt.f64.f32 %fd1, %f1;
rcp.approx.ftz.f64 %fd2, %fd1;
st.global.f32 [%rd2], %f2;
st.global.f32 [%rd2+4], %f3;
st.global.f32 [%rd2+8], %f5;
st.global.f64 [%rd2+16], %fd2;
ret;
}
"""


def test_an_approximate_instruction_of_constants_is_left_to_the_hardware():
    """ptxas evaluates ex2.approx or rcp.approx of a constant itself (rcp.approx.ftz.f32 of
    0.75 became 0x3faaaaab); the hardware's MUFU result need not be that. The operand is
    OR-ed with a zero ptxas cannot see (bit 31 of %dynamic_smem_size), so MUFU runs as in the
    AOT code. An approximation of a loaded value is left alone."""
    from proteus_rewrite.jit import ptx_contract

    body = APPROX_PTX[APPROX_PTX.index("{") + 1 : APPROX_PTX.rindex("}")]
    out, n = ptx_contract.keep_approximations(body)
    assert n == 3
    assert "ex2.approx.ftz.f32 %f2, %pzo0; }" in out and "rcp.approx.ftz.f32 %f3, %pzo1; }" in out
    assert "rcp.approx.ftz.f64 %fd2, %pzo2; }" in out and "cvt.u64.u32 %pza2, %pza2z;" in out
    assert "ex2.approx.ftz.f32 %f5, %f4;" in out


@needs_ptxas
def test_ptxas_assembles_the_approximations_left_to_the_hardware(tmp_path):
    from proteus_rewrite.jit import ptx_contract

    text, n = _rewrite_body(APPROX_PTX, ptx_contract.keep_approximations)
    assert n == 3 and _sass(text, tmp_path)


INDIRECT_PTX = """.version 9.0
.target sm_90
.address_size 64
.func (.param .b32 r) twice(.param .b32 x)
{
.reg .b32 %r<3>;
ld.param.b32 %r1, [x];
add.s32 %r2, %r1, %r1;
st.param.b32 [r], %r2;
ret;
}
.global .align 8 .u64 table[1] = {generic(twice)};
.visible .entry k(.param .u64 p, .param .u32 n)
{
.reg .b32 %r<4>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [p];
ld.param.u32 %r1, [n];
mov.u64 %rd2, twice;
st.global.u32 [%rd1], %r1;
ret;
}
"""


def test_a_function_whose_address_is_taken_is_kept():
    from proteus_rewrite.fatbin import ptx

    module = ptx.items(INDIRECT_PTX)
    assert [f.name for f in ptx.reached(module, "k")] == ["twice", "k"]


def test_a_table_of_function_addresses_is_not_specialized_from_ptx():
    import dataclasses

    from proteus_rewrite.fatbin.table import KernelRecord, ModuleRecord, ParamRecord

    used = INDIRECT_PTX.replace("mov.u64 %rd2, twice;", "ld.global.u64 %rd2, [table];")
    module = ModuleRecord(0, "0" * 64, 90, 0, "", "", (), used.encode(), "sm_90", kind="ptx")
    params = (ParamRecord(0, "pointer", None, 8, 0, 8), ParamRecord(1, "int", "i32", 4, 8, 4))
    k = KernelRecord("k", "k", 0, 90, 0, (), params, 12, ("table",), None, None, None, "cubin", code="ptx")

    class Table:
        modules = (module,)

    launch = Launch(((1 << 40).to_bytes(8, "little"), (5).to_bytes(4, "little")), (1, 1, 1), (32, 1, 1), 90,
                    {"table": 1 << 41})
    plan = specializer.make_plan(k, launch, Config.from_env({}).for_record(k))
    with pytest.raises(SpecializeError, match="holds addresses"):
        ptx_route.specialize_text(Table, k, dataclasses.replace(plan, entry="k$v"), Findings())


def test_an_rdc_kernel_calling_another_file_takes_that_files_definitions(table):
    """nvcc -rdc=true: weigh() calls weight() and updates rdc_calls, both of rdc_device.cu.
    Its record's PTX is its unit with weight()'s definition linked in; the variable stays the
    app's (reached through its pointer)."""
    t = table("rdc_nvcc")
    (k,) = t.kernels
    assert k.code == "ptx" and k.globals == ("rdc_calls",)
    text = t.modules[k.module].code.decode()
    assert ".extern .func" not in text and re.search(r"\.visible \.func \(\.param \.b32 func_retval0\) _Z6weightii\(", text)
    out, plan, _found = _text(t, k, _launch(k))
    assert "atom.global.add.u32 %r3, [%pgv0], 1;" in out or re.search(r"mov\.u64 %rd\d+, %pgv0;", out)


@needs_ptxas
def test_the_linked_rdc_kernel_assembles(table, monkeypatch):
    monkeypatch.setenv("PROTEUS_PTX_COMPILER", "ptxas")
    t = table("rdc_nvcc")
    (k,) = t.kernels
    r = specializer.specialize(t, k, _launch(k), Config.from_env())
    assert r.image.data[:4] == b"\x7fELF"


def test_linking_refuses_a_name_two_files_define_differently():
    from proteus_rewrite.fatbin import ptx

    head = ".version 9.0\n.target sm_90\n.address_size 64\n"
    caller = head + (".extern .func (.param .b32 r) f(.param .b32 x);\n"
                     ".func (.param .b32 r) g(.param .b32 x)\n{\n.reg .b32 %r<2>;\nld.param.b32 %r1, [x];\n"
                     "st.param.b32 [r], %r1;\nret;\n}\n"
                     ".visible .entry k(.param .u32 n)\n{\n.reg .b32 %r<4>;\nld.param.u32 %r1, [n];\n"
                     "{ .param .b32 a; .param .b32 b; st.param.b32 [a], %r1; call.uni (b), f, (a); }\n"
                     "{ .param .b32 a; .param .b32 b; st.param.b32 [a], %r1; call.uni (b), g, (a); }\nret;\n}\n")
    callee = head + (".func (.param .b32 r) g(.param .b32 x)\n{\n.reg .b32 %r<3>;\nld.param.b32 %r1, [x];\n"
                     "add.s32 %r2, %r1, 1;\nst.param.b32 [r], %r2;\nret;\n}\n"
                     ".visible .func (.param .b32 r) f(.param .b32 x)\n{\n.reg .b32 %r<3>;\nld.param.b32 %r1, [x];\n"
                     "{ .param .b32 a; .param .b32 b; st.param.b32 [a], %r1; call.uni (b), g, (a); }\n"
                     "st.param.b32 [r], %r1;\nret;\n}\n")
    # f's file has its own g, a different one: one module cannot hold both
    assert ptx.link([caller, callee], 0, "k") is None
    same_g = callee.replace("add.s32 %r2, %r1, 1;\nst.param.b32 [r], %r2;", "st.param.b32 [r], %r1;")
    same_g = same_g.replace(".reg .b32 %r<3>;\nld.param.b32 %r1, [x];\nst.param", ".reg .b32 %r<2>;\nld.param.b32 %r1, [x];\nst.param", 1)
    linked = ptx.link([caller, same_g], 0, "k")
    assert linked is not None and ".extern .func" not in linked and ptx.analyze(linked.encode())["k"].unresolved == ()


def test_comments_go_and_strings_stay():
    from proteus_rewrite.fatbin import ptx

    text = '.file 1 "/usr//include/x.h"\n// a comment\nmov.u32 %r1, 1; /* and\nanother */ ret;\n'
    assert ptx.strip_comments(text) == '.file 1 "/usr//include/x.h"\n\nmov.u32 %r1, 1;  ret;\n'


@needs_ptxas
def test_a_linked_function_may_call_back_into_the_kernels_file(tmp_path):
    """rdc: f (another file) calls h, defined in the kernel's file: the linked module declares
    f before the kernel uses it and defines it after h, so ptxas takes it whole."""
    import subprocess

    from proteus_rewrite.fatbin import ptx

    head = ".version 9.0\n.target sm_90\n.address_size 64\n"
    call = "{{ .param .b32 a; .param .b32 b; st.param.b32 [a], %r1; call.uni (b), {}, (a); ld.param.b32 %r1, [b]; }}\n"
    fn = (".visible .func (.param .b32 r) {}(.param .b32 x)\n{{\n.reg .b32 %r<3>;\nld.param.b32 %r1, [x];\n{}"
          "st.param.b32 [r], %r1;\nret;\n}}\n")
    home = head + (".extern .func (.param .b32 r) f(.param .b32 x);\n" + fn.format("h", "add.s32 %r1, %r1, 1;\n")
                   + ".visible .entry k(.param .u64 p, .param .u32 n)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<3>;\n"
                   "ld.param.u32 %r1, [n];\n" + call.format("f") + "ld.param.u64 %rd1, [p];\n"
                   "cvta.to.global.u64 %rd2, %rd1;\nst.global.u32 [%rd2], %r1;\nret;\n}\n")
    other = head + ".extern .func (.param .b32 r) h(.param .b32 x);\n" + fn.format("f", call.format("h"))
    linked = ptx.link([home, other], 0, "k")
    assert linked is not None and linked.index("f(.param .b32 x);") < linked.index(".entry k")
    assert linked.index("func (.param .b32 r) h(") < linked.rindex("func (.param .b32 r) f(")
    src = tmp_path / "l.ptx"
    src.write_text(linked)
    subprocess.run([str(PTXAS), "-arch=sm_90", str(src), "-o", str(tmp_path / "l.cubin")], check=True)


def test_dynamic_parallelism_the_child_from_its_ptx_the_parent_as_built(table):
    """nvcc -rdc=true with the device runtime: libcudadevrt's relocatable PTX is for a newer
    architecture than the sm_90 cubin, so it is never taken; the parent, which calls into it,
    runs as built, with the reason; the child takes the PTX route from the sample's own unit."""
    t = table("cdp_nvcc")
    routes = {k.demangled.split("(")[0]: k.code if k.specializable else None for k in t.kernels}
    assert routes["child"] == "ptx" and routes["parent"] is None
    assert all(m.ptx_target == "sm_90" for m in t.modules)
    assert any("parent(float*, int, int) calls device code of another translation unit" in w for w in t.warnings)


@needs_ptxas
def test_half_precision_products_and_approximations_are_kept_too(tmp_path):
    """A half folded from a struct's bytes lands in a .b16 register: mul.f16 of two constants
    into a sub, and ex2.approx.f16 of a constant, get the same treatment as f32, and ptxas
    takes the result."""
    from proteus_rewrite.jit import ptx_contract

    ptx = (".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 p)\n{\n.reg .b16 %rs<8>;\n"
           ".reg .b64 %rd<4>;\nld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd2, %rd1;\nmov.b16 %rs1, 0x3C66;\n"
           "mov.b16 %rs2, 0x3CCD;\nld.global.b16 %rs5, [%rd2];\nmul.f16 %rs3, %rs1, %rs2;\nsub.f16 %rs4, %rs5, %rs3;\n"
           "ex2.approx.f16 %rs6, %rs1;\nst.global.b16 [%rd2], %rs4;\nst.global.b16 [%rd2+2], %rs6;\nret;\n}\n")
    text, n = _rewrite_body(ptx, ptx_contract.keep_contraction)
    text, m = _rewrite_body(text, ptx_contract.keep_approximations)
    assert (n, m) == (1, 1) and "fma.rn.f16 %rs4, %pfc0, %rs2, %rs5;" in text and "cvt.u16.u32 %pza0, %pza0z;" in text
    assert _sass(text, tmp_path)


def test_floats_are_folded_on_request_and_the_variant_assembles(table, tmp_path):
    """PROTEUS_PTX_FOLD_FLOATS=1: a float argument becomes a `mov.f32` of its bits, in a variant
    of its own (the key holds the value), and ptxas assembles it."""
    t = table("loop_count_nvcc")
    k = _kernel(t, "axpy_loop")
    launch = _launch(k, {0: (1000).to_bytes(4, "little"), 1: (8).to_bytes(4, "little"), 2: struct.pack("<f", 1.5)})
    text, plan, _found = _text(t, k, launch, {"PROTEUS_PTX_FOLD_FLOATS": "1"})
    assert sorted(plan.folded) == [0, 1, 2]
    assert re.search(r"mov\.f32 %f\d+, 0f3FC00000;", text) and "_param_2]" not in text
    if PTXAS.exists():
        (tmp_path / "v.ptx").write_text(text)
        import subprocess

        subprocess.run([str(PTXAS), "-arch=sm_90", str(tmp_path / "v.ptx"), "-o", str(tmp_path / "v.cubin")], check=True)
    # the double of poly_eval too; its bool stays an integer
    p = _kernel(t, "poly_eval")
    text, plan, _found = _text(t, p, _launch(p), {"PROTEUS_PTX_FOLD_FLOATS": "1"})
    assert 2 in plan.folded and re.search(r"mov\.f64 %fd\d+, 0d3FD0000000000000;", text)


def test_a_clang_build_is_recorded_from_its_ptx_on_request(samples, tmp_path, monkeypatch):
    """PROTEUS_CODE_KIND=ptx at record time: the kernels of a bitcode build take the PTX route,
    to compare the two routes on one binary."""
    from ..conftest import run_cli

    out = run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "b"))
    assert out.returncode == 0 and "3 with bitcode" in out.stdout
    monkeypatch.setenv("PROTEUS_CODE_KIND", "ptx")
    out = run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "p"))
    assert out.returncode == 0 and "0 with bitcode, 3 from PTX" in out.stdout, out.stdout


def test_an_unknown_code_kind_is_one_line_and_exit_2(samples):
    import os
    import subprocess
    import sys

    from ..conftest import ROOT

    code = "import sys; from proteus_rewrite.cli import run; sys.argv[0] = 'proteus-rewrite'; run()"
    env = dict(os.environ, PROTEUS_CODE_KIND="bogus", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code, "inspect", str(samples / "loop_count")], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and "PROTEUS_CODE_KIND='bogus': expected auto, bitcode or ptx" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
