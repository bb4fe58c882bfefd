"""Device variables reached through pointers (jit/relink.py), on hand-written IR: every use form
clang's output has, each parsed and verified by LLVM afterwards."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import pytest

from proteus_rewrite.errors import SpecializeError
from proteus_rewrite.jit import codegen, relink

HEAD = 'target triple = "nvptx64-nvidia-cuda"\n'


def _ref(name: str) -> str:
    return re.escape("@" + name) + r"(?![-\w$.])"


def _rewrite(body: str, names=("g",), amdgpu=False) -> str:
    text = relink.load_through_pointers(HEAD + body, list(names), "k()", _ref, amdgpu)
    llvm.parse_assembly(text).verify()  # it parses and verifies, or the test fails here
    return text


def test_constant_expressions_around_a_use_become_entry_instructions():
    text = _rewrite("""@g = addrspace(1) global [8 x float] zeroinitializer, align 4
define void @k(i1 %c) {
entry:
  %a = load float, ptr getelementptr inbounds ([8 x float], ptr addrspacecast (ptr addrspace(1) @g to ptr), i64 0, i64 3), align 4
  br i1 %c, label %t, label %f
t:
  store float %a, ptr addrspace(1) @g, align 4
  br label %f
f:
  %p = phi ptr [ addrspacecast (ptr addrspace(1) @g to ptr), %entry ], [ null, %t ]
  store float 1.0, ptr %p, align 4
  ret void
}
""")
    assert not re.search(r"^@g ", text, re.M) and "@g," not in text and "@g to" not in text
    entry = text.split("entry:\n", 1)[1].split("\n  %a")[0]
    assert "load ptr addrspace(1), ptr addrspace(1) @__proteus_gvar_0" in entry and "!invariant.load" in entry
    assert entry.count(" = addrspacecast") == 1  # one instruction for both uses of the same expression
    assert "= getelementptr inbounds [8 x float], ptr %__pg.e0, i64 0, i64 3" in entry
    assert f"inttoptr (i64 {relink.PLACEHOLDER} to ptr addrspace(1))" in text


def test_unlabelled_entry_block_and_a_function_without_uses():
    text = _rewrite("""@g = addrspace(1) global i32 0, align 4
@h = addrspace(4) global i32 0, align 4
define void @other() {
  ret void
}
define i32 @k() {
  %1 = load i32, ptr addrspacecast (ptr addrspace(4) @h to ptr), align 4
  %2 = load i32, ptr addrspace(1) @g, align 4
  %3 = add i32 %1, %2
  ret i32 %3
}
""", names=("g", "h"))
    other = text.split("define void @other() {\n", 1)[1].split("}")[0]
    assert other.strip() == "ret void"
    k = text.split("define i32 @k() {\n", 1)[1]
    assert k.startswith("  %__pg.0 = load") and "@__proteus_gvar_1" in k  # h, a __constant__, is global memory too


def test_amdgpu_constant_address_space_uses_go_through_a_cast():
    text = relink.load_through_pointers('target triple = "amdgcn-amd-amdhsa"\n' + """@c = addrspace(4) global i32 0, align 4
define i32 @k() {
  %1 = load i32, ptr addrspace(4) @c, align 4
  ret i32 %1
}
""", ["c"], "k()", _ref, True)
    llvm.parse_assembly(text).verify()
    assert "%__pg.0.c = addrspacecast ptr addrspace(1) %__pg.0 to ptr addrspace(4)" in text


def test_an_address_held_by_another_variable_is_refused_by_name():
    with pytest.raises(SpecializeError, match="device variable g's address is held by another variable's initializer"):
        relink.load_through_pointers(HEAD + """@g = addrspace(1) global i32 0, align 4
@p = addrspace(1) global ptr addrspacecast (ptr addrspace(1) @g to ptr), align 8
define void @k() {
  store i32 1, ptr addrspace(1) @g, align 4
  ret void
}
""", ["g"], "k()", _ref, False)


def test_a_variable_the_kernel_does_not_use_adds_nothing():
    body = "define void @k() {\n  ret void\n}\n"
    assert relink.load_through_pointers(HEAD + body, ["g"], "k()", _ref, False) == HEAD + body


def test_ptx_initializers_are_patched_by_name():
    ptx = codegen.PTX(".visible .global .align 8 .u64 __proteus_gvar_0 = 0xdeadbeefdeadbeef;\n"
                      ".visible .global .align 8 .u64 __proteus_gvar_1 = 0xdeadbeefdeadbeef;\n", 90)
    out = relink.patch_image(ptx, {"b": 0x2000, "a": 0x1000})  # numbered in sorted order
    assert out.text.splitlines() == [".visible .global .align 8 .u64 __proteus_gvar_0 = 0x1000;",
                                     ".visible .global .align 8 .u64 __proteus_gvar_1 = 0x2000;"]
