"""The specializer: a recorded kernel + one launch -> a cubin (or PTX; for HIP, an AMDGPU code
object) and its cache key.

This is what the shim calls on a cache miss. Steps, each timed:
  plan      decide what to fold (scalars, dims, launch bounds, alignment) from the launch
  key       hash everything that changes the code
  cache     memory, then disk
  ir        specialized module (ir.py)
  optimize  the selected pipeline (pipeline.py)
  ptx       NVPTX backend
  cubin     nvJitLink / ptxas (or none: the driver compiles the PTX)
For a HIP kernel (the launch's arch is a processor name, "gfx90a") the last two steps are
  object    AMDGPU backend
  link      ld.lld -> code object
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

import llvmlite

from .. import __version__
from ..cache import TOMBSTONE, CacheChain, Entry
from ..errors import SpecializeError
from ..fatbin.table import KernelRecord, KernelTable
from . import codegen, occupancy, pipeline, ptx_route, relink, targets
from .config import CodegenConfig, Config
from .launch import Launch, foldable, ir_constant, python_value
from .plan import Plan
from .targets import LLVM_LOCK, Compiled, ms_since

log = logging.getLogger("proteus_rewrite")

ALIGNMENTS = (128, 64, 32, 16, 8)


class CompileBudgetSpent(SpecializeError):
    """A new variant would need compiling, and the kernel's compile budget is spent (or the
    caller asked the caches only). `folded`: the parameters the variant folds; `key`: its cache key."""

    def __init__(self, message: str, folded: tuple[int, ...] = (), key: str = ""):
        super().__init__(message)
        self.folded = folded
        self.key = key


class ClaimedElsewhere(CompileBudgetSpent):
    """Another process (or thread) holds the claim to compile this variant: this launch runs the
    original, and the variant is asked for again later (the run time: as a variant still being
    compiled; prewarm: it waits). A CompileBudgetSpent, so the flow's `spent` ending takes it."""


class FailedElsewhere(SpecializeError):
    """A tombstone: compiling this variant failed in an earlier attempt (here or in another
    process sharing the cache); it is not tried again."""


@dataclass(frozen=True)
class Result:
    key: str
    kernel: str  # the entry point's name in the image: the kernel's own mangled name
    image: codegen.Image
    source: str  # "compiled", "memory" or "disk"
    folded: dict[int, object]  # parameter index -> value, for reports
    plan: Plan
    timings_ms: dict[str, float] = field(default_factory=dict)
    ptx: codegen.PTX | None = None  # None when served from a cache, and for HIP
    ir_text: str | None = None  # optimized IR, when asked for
    notes: tuple[str, ...] = ()  # what the compilation found a user should know (ir.specialize_module)
    sreg_calls: dict[str, int] = field(default_factory=dict)  # reads of each folded special register

    @property
    def entry(self) -> str:
        """The variant's entry point in the image."""
        return self.plan.entry or self.kernel


def make_plan(kernel: KernelRecord, launch: Launch, cg: CodegenConfig, relink_globals: bool = True) -> Plan:
    folded: dict[int, str] = {}
    if cg.specialize_args:
        allowed = set(kernel.jit_args) if kernel.jit_args is not None else None
        for p, raw in zip(kernel.params, launch.args):
            if (foldable(p, kernel.code, cg.ptx_fold_floats) and p.index not in launch.unknown
                    and (allowed is None or p.index + 1 in allowed)):
                # the PTX route reads the bytes back as each `ld.param` loads them
                folded[p.index] = raw.hex() if kernel.code == "ptx" else ir_constant(p, raw)
    alignment = {}
    if cg.specialize_alignment:
        for p, raw in zip(kernel.params, launch.args):
            if p.kind == "pointer" and p.index not in launch.unknown:
                addr = int.from_bytes(raw, "little")
                best = next((a for a in ALIGNMENTS if addr and addr % a == 0), None)
                if best:
                    alignment[p.index] = best
    max_threads = min_ctas = None
    if cg.specialize_launch_bounds and "block" not in launch.unknown_dims:
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        declared = kernel.max_threads[0] * kernel.max_threads[1] * kernel.max_threads[2] if kernel.max_threads else None
        if declared is not None and threads > declared:
            raise SpecializeError(
                f"{kernel.demangled}: block of {threads} threads exceeds its __launch_bounds__ ({declared})"
            )
        max_threads = launch.block
        min_ctas = kernel.min_ctas or 1
        if cg.min_blocks_per_sm and cg.tuned_max_threads == threads:
            min_ctas = cg.min_blocks_per_sm
    globals_ = {}
    if relink_globals:
        missing = [g for g in kernel.globals if g not in launch.globals]
        if missing:
            raise SpecializeError(f"{kernel.demangled}: the address of device variable(s) {', '.join(missing)} is unknown")
        globals_ = {g: launch.globals[g] for g in kernel.globals}
    return Plan(
        folded=folded,
        block=None if "block" in launch.unknown_dims else launch.block,
        grid=None if "grid" in launch.unknown_dims else launch.grid,
        fold_dims=cg.specialize_dims,
        dims_range=cg.specialize_dims_range,
        max_threads=max_threads,
        min_ctas=min_ctas,
        alignment=alignment,
        globals=globals_,
        relink_globals=relink_globals,
        max_registers=_register_cap(kernel, launch, cg),
    )


def _register_cap(kernel: KernelRecord, launch: Launch, cg: CodegenConfig) -> int | None:
    """LLVM 22 + nvJitLink allocate more registers than clang 19 + ptxas for some kernels, and
    the occupancy lost cost more than folding gained (docs/dev/findings/registers.md). So a
    variant may use as many registers as keep the AOT code's blocks per SM at this launch's
    block size (occupancy.py); a variant that serves any block size keeps the AOT count. Only
    where CUDA's occupancy rules apply (the target says)."""
    if not (cg.cap_registers and kernel.aot_registers and targets.target_for(kernel.arch).caps_registers):
        return None
    if "block" in launch.unknown_dims:
        return kernel.aot_registers
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    return occupancy.register_budget(kernel.aot_registers, threads, kernel.arch)


def cache_key(table: KernelTable, kernel: KernelRecord, plan: Plan, cg: CodegenConfig, ptx_target: tuple,
              arch: int | str) -> str:
    """SHA-256 over everything that changes the generated code: what is fixed for the kernel,
    its architecture and the configuration (hashed once, _fixed_key), then the launch's plan."""
    doc = {
        "fixed": _fixed_key(tuple(table.modules[i].sha256 for i in (kernel.module, *kernel.link_modules)),
                            kernel.name, arch, ptx_target, cg,
                            pipeline.Tuning.from_cmdline(table.modules[kernel.module].cmdline)),
        "folded": {str(k): v for k, v in sorted(plan.folded.items())},
        # Dimensions matter when they are folded or bound the kernel; otherwise keep them out,
        # so one variant serves every launch shape.
        "block": plan.block if (plan.fold_dims or plan.dims_range or plan.max_threads) else None,
        "grid": plan.grid if (plan.fold_dims or plan.dims_range) else None,
        "max_threads": plan.max_threads,
        "min_ctas": plan.min_ctas,
        "max_registers": plan.max_registers,
        "alignment": {str(k): v for k, v in sorted(plan.alignment.items())},
        # names only: the addresses are set in the image as it is loaded (relink.py), so one
        # entry serves every process and context
        "globals": sorted(plan.globals),
        "relink_globals": "pointers" if plan.relink_globals else False,
    }
    if kernel.code != "bitcode":
        doc["code"] = [kernel.code, ptx_route.REVISION]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# What this version of the specializer does to a module, beyond what the key's other fields
# name: raised with every change that can change the code for the same inputs, so that a disk
# cache written by an earlier version is not served. 2: undefined values defined as zero,
# clang's pipeline tuning (SLP vectorization), the original kernel's FP attributes kept.
# 3: FP contraction as clang's (-nvptx-fma-level). 4: one more block per SM where it spills little.
# 5: spilling for it only where the blocks per SM grow by half or more.
CODEGEN_REVISION = 5


@functools.lru_cache(maxsize=1024)
def _fixed_key(modules: tuple[str, ...], kernel: str, arch: int | str, ptx_target: tuple, cg: CodegenConfig,
               tuning: pipeline.Tuning) -> str:
    # Every miss computes a key, on the launching thread before it queues a compilation; this
    # part, encoded once per kernel, was a sixth of a miss's Python time (bench/micro/miss_bench.py).
    doc = {
        "tool": __version__,
        "revision": CODEGEN_REVISION,
        "tuning": dataclasses.astuple(tuning),
        "llvmlite": llvmlite.__version__,  # which pins the LLVM version
        "compiler": codegen.compiler_identity(cg.ptx_compiler),
        "modules": list(modules),
        "kernel": kernel,
        "arch": arch,
        "ptx_target": list(ptx_target),
        "config": cg.key_fields(),
    }
    if (note := pipeline.key_note(pipeline.pipeline_text(cg.opt_level, cg.opt_pipeline))) is not None:
        doc["size_levels"] = note
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def specialize(
    table: KernelTable,
    kernel: KernelRecord,
    launch: Launch,
    config: Config | None = None,
    cache: CacheChain | None = None,
    keep_ir: bool = False,
    relink_globals: bool = True,
    driver_version: int | None = None,
    may_compile: bool = True,
    compiler=None,
    missing: str | None = None,
    claim_wait_s: float | None = None,
) -> Result:
    """`compiler`: where compile_variant runs (None: here; the run time passes its compiler
    process, jit/process.py). `missing`: a key the caller has just found in no cache, not asked
    for again (the caches count each lookup). `claim_wait_s`: how long to wait for another
    process that holds the claim to compile this key (0: raise ClaimedElsewhere at once; None:
    the cache's lease and a margin); past it, compile unclaimed."""
    config = config or Config.from_env()
    cg = _resolve_compiler(config.for_record(kernel), driver_version)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    launch.check(kernel)
    if kernel.module is None:
        raise SpecializeError(f"{kernel.demangled}: neither bitcode nor PTX was recorded for this kernel")
    plan = make_plan(kernel, launch, cg, relink_globals)
    target = targets.target_for(launch.arch)
    plan, cg = target.adapt(plan, cg)
    key_target = target.key_target(cg, driver_version)
    key = cache_key(table, kernel, plan, cg, key_target, launch.arch)
    plan = target.named(plan, kernel.name, key)
    folded_values = {i: python_value(kernel.params[i], launch.args[i]) for i in plan.folded}
    timings["plan"] = ms_since(t0)

    def served(hit) -> Result | None:
        if hit is None:
            return None
        if hit[0].kind == TOMBSTONE:
            raise FailedElsewhere(f"{kernel.demangled}: compiling this variant failed before "
                                  f"({hit[0].meta.get('reason', 'no reason recorded')})")
        if (image := target.from_cache(hit[0])) is not None:
            return Result(key, kernel.name, _relinked(image, plan), hit[1], folded_values, plan, timings)
        return None

    if cache is not None and key != missing:  # with keep_ir too, as upstream: only a variant compiled here has IR to show
        if (result := served(cache.get(key))) is not None:
            return result

    if not may_compile:
        raise CompileBudgetSpent(f"{kernel.demangled}: compile budget spent", tuple(plan.folded), key)
    claim = None
    if cache is not None:
        wait = cache.lease_s + 5.0 if claim_wait_s is None else claim_wait_s
        got = cache.acquire(key, wait)
        if isinstance(got, tuple):  # published by the claim's holder while this one waited
            if (result := served(got)) is not None:
                return result
        elif got is None and wait <= 0:
            raise ClaimedElsewhere(f"{kernel.demangled}: being compiled by another process", tuple(plan.folded), key)
        elif got is None:
            log.info("%s: waited %.0f s for another process's compilation: compiling it here", kernel.demangled, wait)
        else:
            claim = got
    try:
        run = compiler.compile if compiler is not None else compile_variant
        try:
            with cache.renewing(claim) if cache is not None else _nothing():
                done = run(table, kernel, plan, cg, launch.arch, target.isa(key_target), keep_ir, timings)
        except SpecializeError as exc:
            if cache is not None and _deterministic(exc):
                cache.tombstone(key, launch.arch, str(exc))
            raise
        image = done.image
        timings["total"] = ms_since(t0)

        if cache is not None:
            cache.put(Entry(key, target.cache_kind(image), launch.arch, image.data,
                            {"kernel": kernel.name, "compile_ms": round(timings["total"], 2), "tool": __version__}))
    finally:
        if claim is not None:
            cache.release(claim)
    return Result(key, kernel.name, _relinked(image, plan), "compiled", folded_values, plan, timings, done.ptx, done.ir_text,
                  tuple(done.found.notes), done.found.sreg_calls)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _deterministic(exc: SpecializeError) -> bool:
    """A failure the same inputs would meet again (published as a tombstone), not one of this
    process's (its compiler process died or could not start, a fault injected for a test)."""
    text = str(exc)
    return "compiler process" not in text and "injected fault" not in text


def _relinked(image: codegen.Image, plan: Plan) -> codegen.Image:
    """The image as this process loads it: the device variables' pointers set (the cache keeps
    the placeholder)."""
    return relink.patch_image(image, plan.globals) if plan.relink_globals else image


def compile_variant(table, kernel: KernelRecord, plan: Plan, cg: CodegenConfig, arch: int | str, isa: int | None,
                    keep_ir: bool, timings: dict[str, float]) -> Compiled:
    """A plan -> loadable code (Compiled: the image, PTX, optimized IR, findings), the stages timed
    into `timings`, by the target `arch` names (targets.py). What runs LLVM and the PTX compiler,
    and nothing else: `table` needs only `modules[i].code` for the kernel's modules. `isa`:
    the newest PTX ISA the driver reads (CUDA; an offline compiler may read less: asking it
    loads it, so that is asked there)."""
    return targets.target_for(arch).compile(table, kernel, plan, cg, isa, keep_ir, timings)


@functools.lru_cache(maxsize=256)
def _resolve_compiler(cg: CodegenConfig, driver_version: int | None) -> CodegenConfig:
    if cg.ptx_compiler != "auto":
        return cg
    # ptxas compiles the PTX as a whole program; nvJitLink compiles it as relocatable code (as
    # `ptxas -c`), which makes longer code of the same PTX and slower variants
    # (docs/dev/findings/ptx-compiler.md). So a toolkit's ptxas comes first, where one is found
    # that the driver can load the output of. Then nvJitLink (a cubin makes the next run's load
    # cheapest), then the driver's own JIT.
    if codegen.ptxas_usable(driver_version):
        return dataclasses.replace(cg, ptx_compiler="ptxas")
    return dataclasses.replace(cg, ptx_compiler="nvjitlink" if codegen.nvjitlink_available() or not driver_version else "driver")


def prepare_keys(config: Config | None = None, driver_version: int | None = None) -> None:
    """What every cache key computes once per process (which PTX compiler, its identity, the
    pipeline's note), without loading a compiler: where the compiler is not warmed up ahead, so
    that a warm run's first launch does not do it (most of it is looking for an nvJitLink
    wheel in every sys.path entry)."""
    config = config or Config.from_env()
    cg = _resolve_compiler(config.for_kernel("proteus_warm_up"), driver_version)
    codegen.compiler_identity(cg.ptx_compiler)
    pipeline.key_note(pipeline.pipeline_text(cg.opt_level, cg.opt_pipeline))


WARM_UP_IR = """
target datalayout = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare float @llvm.fma.f32(float, float, float)
define ptx_kernel void @proteus_warm_up(ptr addrspace(1) %p, i32 %n) {
entry:
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i1, %loop ]
  %a = phi float [ 0.0, %entry ], [ %a1, %loop ]
  %f = sitofp i32 %i to float
  %a1 = call float @llvm.fma.f32(float %f, float %a, float 1.0)
  %i1 = add i32 %i, 1
  %c = icmp slt i32 %i1, %n
  br i1 %c, label %loop, label %done
done:
  %q = getelementptr float, ptr addrspace(1) %p, i32 %t
  store float %a1, ptr addrspace(1) %q
  ret void
}
"""


def warm_up(arch: int, config: Config | None = None, driver_version: int | None = None,
            cg: CodegenConfig | None = None) -> float:
    """Compile a small kernel through every step a specialization takes; returns milliseconds.

    The shim calls this before it starts compile threads. LLVM creates many of its static
    objects on first use, and each registers a destructor that exit() runs; a compile thread
    still inside LLVM when they run crashes the app. After this compilation those objects
    exist, so the shim's exit hook, registered next, runs before their destructors."""
    import llvmlite.binding as llvm

    from . import ir

    t0 = time.perf_counter()
    if cg is None:
        cg = (config or Config.from_env()).for_kernel("proteus_warm_up")
    cg = _resolve_compiler(cg, driver_version)
    isa = codegen.driver_ptx_isa(driver_version) if driver_version else codegen.LLVM_MAX_PTX
    if cg.ptx_compiler != "driver":
        isa = min(isa, codegen.ptx_isa_for(codegen.compiler_cuda_version(cg.ptx_compiler)))
    with LLVM_LOCK:
        pipeline.skip(cg.skip_passes)
        pipeline.unroll_threshold(cg.unroll_threshold)
        context = llvm.create_context()
        module = None
        try:
            module = llvm.parse_assembly(WARM_UP_IR, context)
            pm = llvm.create_new_module_pass_manager()
            pm.add_always_inliner_pass()
            pm.add_global_dead_code_eliminate_pass()
            pm.run(module, llvm.create_pass_builder(ir.any_target_machine(), llvm.create_pipeline_tuning_options()))
            tm = codegen.target_machine(arch, isa, cg.codegen_opt_level)
            pipeline.run(module, tm, pipeline.pipeline_text(cg.opt_level, cg.opt_pipeline))
            ptx = codegen.emit_ptx(module, tm, arch)
        finally:
            if module is not None:
                module.close()
            context.close()
    codegen.compile_ptx(ptx, cg.ptx_compiler, cg.codegen_opt_level)
    return ms_since(t0)
