"""The JIT specializer on the samples: what gets folded, and what the generated code shows."""

from __future__ import annotations

import dataclasses
import json
import re
import struct

import pytest

from proteus_rewrite.cache import CacheChain, StorageCache
from proteus_rewrite.errors import SpecializeError
from proteus_rewrite.fatbin import elf64
from proteus_rewrite.fatbin.kernels import ParamRecord
from proteus_rewrite.jit import Config, Launch, codegen, occupancy, relink, specialize, specializer, targets
from proteus_rewrite.jit.launch import ir_constant

from ..support.launches import PTR_X, PTR_Y, kernel, launch_for  # noqa: F401  (other tests import them here too)


def has_back_edge(ptx: str) -> bool:
    """A branch to a label defined earlier: a loop."""
    labels = {m.group(1): m.start() for m in re.finditer(r"^(\$L__\w+):", ptx, re.M)}
    return any(labels.get(m.group(1), 1 << 60) < m.start() for m in re.finditer(r"bra(?:\.uni)?\s+(\$L__\w+);", ptx))


def ptx_body(result) -> str:
    return "\n".join(l for l in result.ptx.text.splitlines() if l.strip() and not l.lstrip().startswith("//"))


CFG = Config.from_env({})


def test_trip_count_is_folded_and_the_loop_fully_unrolled(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    r = specialize(t, k, launch_for(k, {0: "1048576", 1: "8", 2: "0.5"}), CFG)
    body = ptx_body(r)
    assert r.folded == {0: 1048576, 1: 8, 2: 0.5}
    assert body.count("fma.rn.f32") == 8  # one per iteration, no loop left
    assert "0f3F000000" in body  # a = 0.5 is an immediate
    assert "1048575" in body  # i < n became i > 1048575
    assert not re.search(rf"ld\.param\.\w+\s+%\w+, \[{re.escape(r.entry)}_param_[012]\]", body)
    assert not has_back_edge(body)


def test_unknown_trip_count_keeps_the_loop(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    launch = launch_for(k, {0: "1048576", 2: "0.5"})
    r = specialize(t, k, Launch(launch.args, launch.grid, launch.block, 90, unknown=frozenset({1})), CFG)
    assert 1 not in r.folded
    assert f"{r.entry}_param_1" in ptx_body(r).split("{", 1)[1]
    assert has_back_edge(ptx_body(r))


def test_launch_bounds_from_the_block_size(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    body = ptx_body(specialize(t, k, launch_for(k, {1: "3"}, block=(128, 2, 1)), CFG))
    assert ".maxntid 128, 2, 1" in body and ".minnctapersm 1" in body


def test_declared_launch_bounds_are_kept_and_never_exceeded(table):
    t = table("templates")
    k = kernel(t, "bounded_sum")
    body = ptx_body(specialize(t, k, launch_for(k, {2: "1000", 3: "16"}, block=(128, 1, 1)), CFG))
    assert ".maxntid 128, 1, 1" in body and ".minnctapersm 4" in body
    body = ptx_body(specialize(t, k, launch_for(k, {2: "1000", 3: "16"}, block=(64, 1, 1)), CFG))
    assert ".maxntid 64, 1, 1" in body and ".minnctapersm 4" in body
    with pytest.raises(SpecializeError, match="exceeds its __launch_bounds__"):
        specialize(t, k, launch_for(k, {2: "1000"}, block=(256, 1, 1)), CFG)


def test_dims_are_folded_only_when_asked(table):
    t = table("multi_kernel")
    k = kernel(t, "scale")
    on = ptx_body(specialize(t, k, launch_for(k, {1: "1000", 2: "2.0"}), CFG))
    off = ptx_body(specialize(t, k, launch_for(k, {1: "1000", 2: "2.0"}), Config.from_env({"PROTEUS_SPECIALIZE_DIMS": "0"})))
    assert "%ntid.x" not in on and "%ntid.x" in off


def test_no_specialization_at_all_still_compiles_the_original_semantics(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    off = Config.from_env({"PROTEUS_SPECIALIZE_ARGS": "0", "PROTEUS_SPECIALIZE_DIMS": "0", "PROTEUS_SPECIALIZE_LAUNCH_BOUNDS": "0"})
    r = specialize(t, k, launch_for(k, {0: "10", 1: "8", 2: "0.5"}), off)
    body = ptx_body(r)
    assert r.folded == {} and ".maxntid" not in body
    assert all(f"{r.entry}_param_{i}" in body.split("{", 1)[1] for i in range(5))


def _pointers(image) -> dict[str, int]:
    offsets = elf64.symbol_offsets(image.data, {relink.pointer_name(i) for i in range(8)})
    return {n: int.from_bytes(image.data[o : o + s], "little") for n, (o, s) in offsets.items()}


def test_device_globals_are_reached_through_pointers_set_to_the_aot_addresses(table):
    t = table("device_globals")
    addrs = {"hits": 0x7F00DEAD1000, "table": 0x7F00DEAD2000, "coeffs": 0x7F00DEAD3000}
    for prefix in ("accumulate", "apply"):
        k = kernel(t, prefix)
        r = specialize(t, k, launch_for(k, {k.params[-1].index: "1048576"}, globals_=addrs), CFG)
        body = ptx_body(r)
        for name, addr in addrs.items():
            assert not re.search(rf"\.global .*\b{name}\b", body), name  # no JIT-side copy
            assert str(addr) not in body and f"{addr:x}" not in body  # nor its address in the code
        assert ".const" not in body  # __constant__ data is read from the AOT copy in global memory
        assert re.search(r"ld\.global\.nc\.b64\s+%rd\d+, \[__proteus_gvar_\d\]", body)
        # names sorted: coeffs, hits, table
        assert _pointers(r.image) == {"__proteus_gvar_0": 0x7F00DEAD3000, "__proteus_gvar_1": 0x7F00DEAD1000,
                                      "__proteus_gvar_2": 0x7F00DEAD2000}


def test_device_global_addresses_are_required_and_not_part_of_the_key(table, tmp_path):
    t = table("device_globals")
    k = kernel(t, "apply")
    with pytest.raises(SpecializeError, match="address of device variable"):
        specialize(t, k, launch_for(k, {2: "10"}), CFG)
    a = {"hits": 0x1000, "table": 0x2000, "coeffs": 0x3000}
    b = dict(a, table=0x9000)
    cache = CacheChain([StorageCache(tmp_path)])
    ra = specialize(t, k, launch_for(k, {2: "10"}, globals_=a), CFG, cache=cache)
    rb = specialize(t, k, launch_for(k, {2: "10"}, globals_=b), CFG, cache=cache)  # another process's addresses
    assert (ra.source, rb.source) == ("compiled", "disk") and ra.key == rb.key
    assert _pointers(ra.image)["__proteus_gvar_2"] == 0x2000 and _pointers(rb.image)["__proteus_gvar_2"] == 0x9000
    stored = cache.get(ra.key)[0].data  # the cache keeps the placeholder, set anew at each load
    assert set(_pointers(codegen.Cubin(stored, 90)).values()) == {relink.PLACEHOLDER}
    assert len(ra.image.data) == len(rb.image.data) == len(stored)


def test_annotated_kernel_folds_exactly_its_annotated_arguments(table):
    t = table("annotated")
    (k,) = t.kernels
    r = specialize(t, k, launch_for(k, {1: "1048576", 2: "6", 3: "1.5"}), CFG)
    assert sorted(r.folded) == [1, 2]  # annotate("jit", 2, 3) is 1-based
    body = ptx_body(r).split("{", 1)[1]
    assert f"{r.entry}_param_3" in body and f"{r.entry}_param_2" not in body


def test_struct_by_value_templates_and_rdc_kernels_specialize(table):
    for app, prefix, values in (("templates", "affine", {}), ("templates", "void scale_add<double, 2>", {2: "-0.75", 3: "1000"}),
                                ("two_tu_rdc", "histogram", {1: "1000", 3: "64"})):
        t = table(app)
        k = kernel(t, prefix)
        r = specialize(t, k, launch_for(k, values), CFG)
        assert f".entry {r.entry}(" in r.ptx.text
        assert r.image.data[:4] == b"\x7fELF"


def test_the_entry_point_is_named_for_its_variant_and_keeps_the_parameter_layout(table):
    from proteus_rewrite.fatbin import cubin

    t = table("templates")
    k = kernel(t, "affine")
    r = specialize(t, k, launch_for(k, {}), CFG)
    c = cubin.parse(r.image.data)
    # the original's name and the key's start: a profiler shows which launches ran a variant
    assert list(c.kernels) == [r.entry] == [f"{k.name}$proteus${r.key[:12]}"]
    assert [(p.offset, p.size) for p in c.kernels[r.entry].params] == [(p.offset, p.size) for p in k.params]


@pytest.mark.parametrize("compiler", ["nvjitlink", "ptxas"])
def test_ptx_compilers_produce_a_cubin(table, compiler):
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    r = specialize(t, k, launch_for(k, {0: "262144", 1: "5", 2: "-42"}), Config.from_env({"PROTEUS_PTX_COMPILER": compiler}))
    assert r.image.data[:4] == b"\x7fELF" and r.image.arch == 90


@pytest.mark.parametrize("release,driver,usable", [("13.0", 13000, True), ("12.8", 13000, True), ("13.1", 13000, False),
                                                   ("13.1", None, True), (None, 13000, False)])
def test_auto_takes_a_ptxas_the_driver_can_load_the_output_of(tmp_path, monkeypatch, release, driver, usable):
    """auto: ptxas (whole-program code) where one is found whose release the driver is not
    older than; else nvJitLink. `None` release: no ptxas at all."""
    if release:
        fake = tmp_path / "ptxas"
        fake.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "none"))
    for f in (codegen.compiler_cuda_version, codegen.compiler_identity, codegen.ptxas_usable, specializer._resolve_compiler):
        f.cache_clear()
    try:
        assert codegen.ptxas_usable(driver) is usable
        chosen = specializer._resolve_compiler(Config.from_env({}).for_kernel("k"), driver).ptx_compiler
        assert (chosen == "ptxas") is usable
        if usable:
            assert codegen.compiler_identity("ptxas") == f"ptxas {release}"
    finally:
        for f in (codegen.compiler_cuda_version, codegen.compiler_identity, codegen.ptxas_usable, specializer._resolve_compiler):
            f.cache_clear()


@pytest.mark.parametrize("compiler", ["nvjitlink", "ptxas"])
@pytest.mark.parametrize("level", ["0", "1", "2"])
def test_every_codegen_opt_level_compiles(table, compiler, level):
    # nvJitLink's -O takes 0 or 3 only: upstream's tuned_config.json (CodeGenOptLevel 2) failed
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    r = specialize(t, k, launch_for(k, {1: "5"}), Config.from_env({"PROTEUS_PTX_COMPILER": compiler,
                                                                  "PROTEUS_CODEGEN_OPT_LEVEL": level}))
    assert r.image.data[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_driver_compiler_leaves_ptx_for_the_driver(table):
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    r = specialize(t, k, launch_for(k, {1: "5"}), Config.from_env({"PROTEUS_PTX_COMPILER": "driver"}))
    assert ".version" in r.image.text and f".entry {r.entry}(" in r.image.text and r.entry.startswith("_Z10mix_roundsyjxPy$proteus$")


def test_key_changes_with_every_input_of_the_code(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    base = launch_for(k, {0: "100", 1: "8", 2: "0.5"})
    keys = {
        specialize(t, k, base, CFG).key,
        specialize(t, k, launch_for(k, {0: "100", 1: "9", 2: "0.5"}), CFG).key,
        specialize(t, k, launch_for(k, {0: "100", 1: "8", 2: "0.5"}, block=(128, 1, 1)), CFG).key,
        specialize(t, k, launch_for(k, {0: "100", 1: "8", 2: "0.5"}, grid=(8, 1, 1)), CFG).key,
        specialize(t, k, base, Config.from_env({"PROTEUS_OPT_LEVEL": "2"})).key,
        specialize(t, k, base, Config.from_env({"PROTEUS_SPECIALIZE_LAUNCH_BOUNDS": "0"})).key,
    }
    assert len(keys) == 6
    assert specialize(t, k, base, CFG).key == specialize(t, k, base, CFG).key


def test_pointer_values_do_not_change_the_key_unless_alignment_is_specialized(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    a = launch_for(k, {1: "8"})
    moved = Launch(a.args[:3] + ((PTR_X + 4).to_bytes(8, "little"), a.args[4]), a.grid, a.block, 90)
    assert specialize(t, k, a, CFG).key == specialize(t, k, moved, CFG).key
    align = Config.from_env({"PROTEUS_SPECIALIZE_ALIGNMENT": "1"})
    ra, rm = specialize(t, k, a, align), specialize(t, k, moved, align)
    assert ra.key != rm.key and ra.plan.alignment == {3: 128, 4: 128} and rm.plan.alignment == {4: 128}


def test_tuned_kernel_config_overrides_per_kernel(table, tmp_path):
    import json

    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"axpy_loop(int, int, float, float const*, float*)": {"SpecializeArgs": False, "Pipeline": "default<O2>"}}))
    cfg = Config.from_env({"PROTEUS_TUNED_KERNELS": str(tuned)})
    t = table("loop_count")
    assert specialize(t, kernel(t, "axpy_loop"), launch_for(kernel(t, "axpy_loop"), {1: "8"}), cfg).folded == {}
    k = kernel(t, "mix_rounds")
    assert specialize(t, k, launch_for(k, {1: "5"}), cfg).folded != {}


def test_textual_pipeline_is_applied(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    light = Config.from_env({"PROTEUS_OPT_PIPELINE": "function(sroa,instcombine,simplifycfg)"})
    r = specialize(t, k, launch_for(k, {0: "100", 1: "8", 2: "0.5"}), light)
    assert has_back_edge(r.ptx.text)  # without loop passes, the (AOT-unrolled-by-8) loop stays
    assert not has_back_edge(specialize(t, k, launch_for(k, {0: "100", 1: "8", 2: "0.5"}), CFG).ptx.text)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"PROTEUS_OPT_LEVEL": "4"}, "PROTEUS_OPT_LEVEL"),
        ({"PROTEUS_SPECIALIZE_ARGS": "maybe"}, "expected 0 or 1"),
        ({"PROTEUS_PTX_COMPILER": "nvcc"}, "PROTEUS_PTX_COMPILER"),
        ({"PROTEUS_TUNED_KERNELS": "/nonexistent.json"}, "cannot read"),
        ({"PROTEUS_ASYNC_COMPILATION": "2"}, "expected 0, 1 or auto"),
        ({"PROTEUS_ASYNC_THREADS": "0"}, "expected auto or 1 to 64"),
        ({"PROTEUS_ASYNC_THREADS": "many"}, "PROTEUS_ASYNC_THREADS='many'"),
        ({"PROTEUS_SKIP_PASSES": "indvars,Loop Unroll"}, "'Loop Unroll' is not a pass name"),
        ({"PROTEUS_UNROLL_THRESHOLD": "lots"}, "PROTEUS_UNROLL_THRESHOLD='lots': expected a whole number"),
        ({"PROTEUS_UNROLL_THRESHOLD": "-1"}, "expected a whole number from 0 to 1000000"),
    ],
)
def test_bad_configuration_is_a_clear_error(env, message):
    with pytest.raises(SpecializeError, match=message):
        Config.from_env(env)


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), (" Auto ", "auto"), ("0", "0"), ("off", "0"),
                                         ("1", "1"), ("yes", "1")])
def test_async_compilation_modes(value, mode):
    assert Config.from_env({} if value is None else {"PROTEUS_ASYNC_COMPILATION": value}).async_compilation == mode


def test_compile_threads_default_to_a_quarter_of_the_cpus_up_to_four(monkeypatch):
    from proteus_rewrite.jit.config import auto_compile_threads
    assert [auto_compile_threads(n) for n in (1, 2, 7, 8, 12, 16, 128)] == [1, 1, 1, 2, 3, 4, 4]
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(12)))  # taskset, a cgroup's cpuset
    assert Config.from_env({}).async_threads == Config.from_env({"PROTEUS_ASYNC_THREADS": " Auto "}).async_threads == 3
    assert Config.from_env({"PROTEUS_ASYNC_THREADS": "6"}).async_threads == 6


def test_skipped_passes_default_to_indvars_and_cannot_come_back_in_a_process(table):
    assert CFG.codegen.skip_passes == ("indvars",)
    assert Config.from_env({"PROTEUS_SKIP_PASSES": ""}).codegen.skip_passes == ()
    assert Config.from_env({"PROTEUS_SKIP_PASSES": " licm, indvars "}).codegen.skip_passes == ("indvars", "licm")
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    specialize(t, k, launch_for(k, {1: "8"}), CFG)  # this process now skips indvars (LLVM's -opt-disable)
    again = Config.from_env({"PROTEUS_SKIP_PASSES": ""})
    with pytest.raises(SpecializeError, match="already skips indvars, and LLVM cannot run a skipped pass again"):
        specialize(t, k, launch_for(k, {1: "8"}), again)
    cached = specialize(t, k, launch_for(k, {1: "8"}), CFG)
    assert cached.key != specializer.cache_key(t, k, cached.plan, again.codegen, ("compiler", 90), 90)


def test_the_unroll_threshold_is_llvms_and_enters_the_cache_key(table):
    assert CFG.codegen.unroll_threshold is None
    high = Config.from_env({"PROTEUS_UNROLL_THRESHOLD": " 1000 "})
    assert high.codegen.unroll_threshold == 1000
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    plan = specializer.make_plan(k, launch_for(k, {1: "8"}), CFG.codegen)
    assert specializer.cache_key(t, k, plan, high.codegen, ("compiler", 90), 90) != \
        specializer.cache_key(t, k, plan, CFG.codegen, ("compiler", 90), 90)


def test_unknown_pipeline_pass_lists_the_supported_ones(table):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    with pytest.raises(SpecializeError, match="unknown or unsupported pass 'frobnicate'.*instcombine"):
        specialize(t, k, launch_for(k, {1: "8"}), Config.from_env({"PROTEUS_OPT_PIPELINE": "frobnicate"}))


def _p(t, size):
    return ParamRecord(0, "float" if t in ("float", "double", "half") else "int", t, size, 0, size)


@pytest.mark.parametrize(
    "llvm_type, raw, expected",
    [
        ("i32", struct.pack("<i", -7), "-7"),
        ("i64", struct.pack("<q", -(2**63)), str(-(2**63))),
        ("i8", b"\xff", "-1"),
        ("i1", b"\x01", "true"),
        ("float", struct.pack("<f", 0.5), "0x3FE0000000000000"),
        ("float", struct.pack("<f", float("inf")), "0x7FF0000000000000"),
        ("float", struct.pack("<I", 0x7FC00001), "0x7FF8000020000000"),  # NaN payload kept
        ("double", struct.pack("<d", -2.5), "0xC004000000000000"),
        ("half", struct.pack("<e", 1.0), "0xH3C00"),
    ],
)
def test_argument_bytes_become_exact_ir_constants(llvm_type, raw, expected):
    assert ir_constant(_p(llvm_type, len(raw)), raw) == expected


def test_warm_up_compiles_a_kernel_through_every_step():
    # the shim runs this before it starts compile threads (see specializer.warm_up)
    assert specializer.warm_up(90) > 0


def test_registers_are_capped_at_the_aot_occupancy_unless_turned_off(table, tmp_path):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    assert k.aot_registers and 0 < k.aot_registers <= 255  # from the cubin's EIATTR_REGCOUNT
    launch = launch_for(k, {1: "3"}, block=(1024, 1, 1))
    capped = specialize(t, k, launch, CFG)
    # a 1024-thread block: as many registers as still fit the AOT code's blocks on an SM
    budget = occupancy.register_budget(k.aot_registers, 1024, 90)
    assert budget >= k.aot_registers and occupancy.blocks_per_sm(budget, 1024, 90) == \
        occupancy.blocks_per_sm(k.aot_registers, 1024, 90)
    assert f".maxnreg {budget}" in ptx_body(capped)
    # a variant that serves any block size cannot know the block: the AOT count itself
    any_block = dataclasses.replace(launch, unknown_dims=frozenset({"block", "grid"}))
    assert f".maxnreg {k.aot_registers}" in ptx_body(specialize(t, k, any_block, CFG))
    free = specialize(t, k, launch, Config.from_env({"PROTEUS_CAP_REGISTERS": "0"}))
    assert ".maxnreg" not in ptx_body(free) and free.key != capped.key
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({k.name: {"CapRegisters": False}}))
    assert ".maxnreg" not in ptx_body(specialize(t, k, launch, Config.from_env({"PROTEUS_TUNED_KERNELS": str(tuned)})))


def test_size_levels_optimize_for_size(table):
    """PROTEUS_OPT_LEVEL s and z: every function optsize (z: minsize too) and LLVM's inliner
    thresholds for them, over the O2 pipeline. 16 folded rounds: O2 and O3 unroll the loop
    fully; s and z keep it, and their code is smaller."""
    t = table("loop_count")
    k = kernel(t, "mix_rounds")
    launch = launch_for(k, {0: "1048576", 1: "16", 2: "-42"})
    speed = {lvl: specialize(t, k, launch, Config.from_env({"PROTEUS_OPT_LEVEL": lvl}), keep_ir=True) for lvl in "23"}
    size = {lvl: specialize(t, k, launch, Config.from_env({"PROTEUS_OPT_LEVEL": lvl}), keep_ir=True) for lvl in "sz"}
    assert not any(has_back_edge(r.ptx.text) for r in speed.values())
    assert all(has_back_edge(r.ptx.text) for r in size.values())
    assert max(len(r.ptx.text) for r in size.values()) < min(len(r.ptx.text) for r in speed.values())
    attrs = {lvl: r.ir_text[r.ir_text.index("attributes #"):] for lvl, r in {**speed, **size}.items()}  # the groups
    assert "optsize" in attrs["s"] and "minsize" not in attrs["s"] and "minsize" in attrs["z"]
    assert "optsize" not in attrs["2"] and "optsize" not in attrs["3"]
    # their cache keys differ from what the same settings gave when s and z ran plain O2
    keys = {lvl: r.key for lvl, r in {**speed, **size}.items()}
    assert len(set(keys.values())) == 4
    from proteus_rewrite.jit import pipeline

    assert pipeline.key_note("default<Oz>") and pipeline.key_note("default<O3>") is None


def _stepping(monkeypatch, first, second, aot=130):
    """targets.step_occupancy over a fake PTX compiler: `first` is the variant at the AOT occupancy,
    `second` what ptxas makes of it with one more block per SM (registers, stack)."""
    from proteus_rewrite.fatbin import cubin
    from proteus_rewrite.jit import codegen, targets
    from proteus_rewrite.jit.plan import Findings, Plan

    made = []
    monkeypatch.setattr(codegen, "compile_ptx", lambda ptx, *a: made.append(ptx.text) or codegen.Cubin(b"2", 90))
    monkeypatch.setattr(cubin, "resources", lambda data: {"k": cubin.Resources(*(first if data == b"1" else second))})
    plan = Plan({}, (256, 1, 1), None, True, False, (256, 1, 1), 1, max_registers=255, entry="k")
    ptx = codegen.PTX(".entry k\n.maxntid 256, 1, 1\n.minnctapersm 1\n.maxnreg 255\n{\n}\n", 90)
    found = Findings()
    out_ptx, image = targets.step_occupancy(ptx, codegen.Cubin(b"1", 90), plan, aot, specializer.CodegenConfig(),
                                                 90, found)
    return out_ptx, image, made, found


def test_occupancy_step_takes_one_more_block_per_sm_when_it_spills_little(monkeypatch):
    # rsbench's lookup on the H100: 151 registers (one block of 256), 128 with 40 more bytes
    ptx, image, made, found = _stepping(monkeypatch, (151, 104), (128, 144))
    assert image.data == b"2" and ".maxnreg 128" in ptx.text and len(made) == 1
    assert "2 blocks per SM" in found.notes[0]


def test_occupancy_step_keeps_the_first_variant_when_it_would_spill_much(monkeypatch):
    ptx, image, made, found = _stepping(monkeypatch, (151, 104), (128, 104 + targets.STEP_MAX_STACK_GROWTH + 8))
    assert image.data == b"1" and ".maxnreg 255" in ptx.text and len(made) == 1
    assert "kept 151 registers" in found.notes[0]


def test_occupancy_step_spills_only_for_a_large_gain_in_residency(monkeypatch):
    # feynman-kac's fk on the H100: 55 registers (4 blocks of 256) against 48 and 8 bytes of spill
    # for a fifth block ran 6% slower; lulesh's calcMonotonicQGradientsForElems, 1 -> 2 blocks for
    # 32 bytes, 30% faster
    ptx, image, _made, found = _stepping(monkeypatch, (55, 0), (48, 8), aot=56)
    assert image.data == b"1" and ".maxnreg 255" in ptx.text and "kept 55 registers" in found.notes[0]
    ptx, image, _made, _found = _stepping(monkeypatch, (55, 0), (48, 0), aot=56)   # no spill: taken
    assert image.data == b"2" and ".maxnreg 48" in ptx.text
    ptx, image, _made, _found = _stepping(monkeypatch, (136, 0), (128, 32))
    assert image.data == b"2" and ".maxnreg 128" in ptx.text


def test_occupancy_step_is_not_tried_where_it_cannot_pay(monkeypatch):
    # already above the AOT code's residency, or too many registers to shed (sw4ck's kernel1: 255)
    for first in ((120, 0), (255, 80)):
        _ptx, image, made, _found = _stepping(monkeypatch, first, (128, 0))
        assert image.data == b"1" and not made
