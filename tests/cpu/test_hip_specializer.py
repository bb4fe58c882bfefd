"""AMDGPU specialization, checked with LLVM's own tools (no AMD GPU here): a launch's values
folded into the recorded bitcode, O3, an object from llvmlite's AMDGPU backend, ld.lld into a
code object whose kernel, descriptor, launch bound and folded constants are all visible."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from proteus_rewrite.fatbin import amdgpu_codeobj, elf64, extract
from proteus_rewrite.jit import codegen, ir, pipeline, relink
from proteus_rewrite.jit.plan import Plan

from ..support.hip_samples import hip_samples

READELF = shutil.which("llvm-readelf-19") or shutil.which("llvm-readelf")
OBJDUMP = shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")


def _tools():
    if not (READELF and OBJDUMP):
        pytest.skip("needs llvm-readelf and llvm-objdump (apt-get install llvm-19; scripts/install-deps)")
    try:
        codegen.lld_path()
    except Exception as exc:
        pytest.skip(str(exc))


def _plan(folded, block=(256, 1, 1), globals_=None):
    return Plan(folded=folded, block=block, grid=(64, 1, 1), fold_dims=True, dims_range=False, max_threads=block,
                min_ctas=1, alignment={}, globals=globals_ or {}, relink_globals=True)


def _compile(table, kernel, plan, arch):
    module = ir.specialize_module(table, kernel, plan)
    tm = codegen.amdgpu_target_machine(arch, 3)
    pipeline.run(module, tm, pipeline.pipeline_text(3, None))
    return module, codegen.link_code_object(codegen.emit_amdgpu_object(module, tm), arch)


def _tool(path, *args, co) -> str:
    proc = subprocess.run([path, *args, co], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_processors_llvm_22_dropped_are_refused_not_crashed_on():
    from proteus_rewrite.errors import SpecializeError

    with pytest.raises(SpecializeError, match="gfx940 is not a processor .* build the app for gfx942"):
        codegen.amdgpu_target_machine("gfx940", 3)


@pytest.mark.parametrize("arch", ["gfx90a"])
def test_folded_trip_count_and_coefficient_reach_the_disassembly(tmp_path, arch):
    _tools()
    table = extract(hip_samples() / "loop_count")
    kernel = next(k for k in table.kernels if k.name == "_Z9axpy_loopiifPKfPf" and k.arch == arch)
    _, co = _compile(table, kernel, _plan({1: "8", 2: "0x3FE0000000000000"}), arch)  # iters=8, a=0.5
    path = tmp_path / "jit.co"
    path.write_bytes(co.data)
    header = _tool(READELF, "-h", "-n", "-s", "--dyn-syms", co=str(path))
    assert re.search(rf"Flags:\s+0x[0-9A-Fa-f]+, {arch}", header)
    assert "_Z9axpy_loopiifPKfPf.kd" in header
    assert ".max_flat_workgroup_size: 256" in header
    asm = _tool(OBJDUMP, "-d", f"--mcpu={arch}", co=str(path))
    fmas = re.findall(r"v_fmac?_f32\S*\s+v\d+, 0\.5,", asm)
    assert len(fmas) == 8  # the 8-trip loop, unrolled, with a = 0.5 as an inline constant
    assert "s_cbranch_scc" not in asm.split("<_Z9axpy_loopiifPKfPf>:")[1]  # no loop left
    parsed = amdgpu_codeobj.parse(co.data)  # our own reader agrees
    assert parsed.arch == arch
    assert [(a.offset, a.size) for a in parsed.kernels["_Z9axpy_loopiifPKfPf"].params] == [
        (p.offset, p.size) for p in kernel.params]  # same kernarg layout: the app's arguments still fit


def test_unfolded_kernel_keeps_its_loop(tmp_path):
    _tools()
    table = extract(hip_samples() / "loop_count")
    kernel = next(k for k in table.kernels if k.name == "_Z9axpy_loopiifPKfPf" and k.arch == "gfx90a")
    _, co = _compile(table, kernel, _plan({}), "gfx90a")
    path = tmp_path / "jit.co"
    path.write_bytes(co.data)
    asm = _tool(OBJDUMP, "-d", "--mcpu=gfx90a", co=str(path))
    assert "s_cbranch" in asm and len(re.findall(r"v_fmac?_f32\S*\s+v\d+, 0\.5,", asm)) == 0


def test_declared_launch_bound_and_target_attributes_carry_over():
    table = extract(hip_samples() / "templates")
    kernel = next(k for k in table.kernels if k.name == "_Z11bounded_sumPKfPfii" and k.arch == "gfx940")
    module = ir.specialize_module(table, kernel, _plan({3: "16"}, block=(64, 1, 1)))
    text = str(module)
    define = next(line for line in text.splitlines() if line.startswith("define") and "bounded_sum" in line)
    assert "amdgpu_kernel" in define
    group = re.search(r"#(\d+)", define.split(")")[-1]).group(0)
    attrs = next(line for line in text.splitlines() if line.startswith(f"attributes {group} "))
    assert '"amdgpu-flat-work-group-size"="1,64"' in attrs and '"target-cpu"="gfx940"' in attrs


def test_device_variables_are_reached_through_pointers_patched_in_the_code_object(tmp_path):
    _tools()
    table = extract(hip_samples() / "device_globals")
    kernel = next(k for k in table.kernels if k.name == "_Z5applyPfPKfi" and k.arch == "gfx90a")
    addrs = {"coeffs": 0x7F0000001000, "hits": 0x7F0000002000, "table": 0x7F0000003000}
    module, co = _compile(table, kernel, _plan({2: "1024"}, globals_=addrs), "gfx90a")
    text = str(module)
    assert not any(re.search(rf"^@{name} ", text, re.M) for name in addrs)  # no copies of its own
    assert not any(str(a) in text for a in addrs.values())  # no address in the code: one image for every process
    patched = relink.patch_image(co, addrs)
    offsets = elf64.symbol_offsets(patched.data, {relink.pointer_name(i) for i in range(3)})
    assert len(offsets) == 3
    for i, name in enumerate(sorted(addrs)):
        off, size = offsets[relink.pointer_name(i)]
        assert int.from_bytes(patched.data[off : off + size], "little") == addrs[name]
        assert int.from_bytes(co.data[off : off + size], "little") == relink.PLACEHOLDER
    path = tmp_path / "jit.co"
    path.write_bytes(patched.data)
    assert "_Z5applyPfPKfi.kd" in _tool(READELF, "-s", co=str(path))  # still a well-formed object
