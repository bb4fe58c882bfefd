"""The two code targets behind one interface: NVPTX (CUDA: PTX, then a cubin) and AMDGPU (HIP:
an object, linked by ld.lld into a code object, what hipModuleLoadData takes).

`target_for(arch)` is the one place that tells the platforms apart (an SM version is CUDA, a
processor name such as "gfx90a" is HIP); the specializer, the run time and the command line ask
the target it returns and never branch on the type of `arch` themselves. A target says what of
a plan reaches its code, what its cache key names, how a cached entry becomes an image, what the
shim does for it beyond launching variants (speed trials, validation, loading ahead), and
compiles: the LLVM part both share (`optimize_and_emit`), then its own backend.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from dataclasses import dataclass

from .. import faults
from ..cache import Entry
from ..fatbin import cubin as cubin_format
from . import codegen, occupancy, pipeline, ptx_route
from .config import CodegenConfig
from .plan import Findings, Plan, variant_name

# ctypes lets go of the GIL during every LLVM call, so compile threads (PROTEUS_ASYNC_THREADS)
# would meet inside LLVM: the steps that run it take this lock (cache lookups and PTX -> cubin
# do not). Each compilation also works in an LLVM context of its own and closes its modules on
# its own thread, so nothing of it is freed later by the garbage collector on another thread,
# and LLVM's global context does not grow with every variant's constants.
LLVM_LOCK = threading.Lock()


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


@dataclass
class Compiled:
    """What a target makes of a plan (and what a compiler process answers)."""

    image: codegen.Image
    ptx: codegen.PTX | None  # CUDA only
    ir_text: str | None  # optimized IR, when asked for
    found: Findings = dataclasses.field(default_factory=lambda: Findings())


def optimize_and_emit(table, kernel, plan, cg: CodegenConfig, keep_ir: bool, timings: dict[str, float],
                      target_machine, emit, fault: str, stage: str, found):
    """The LLVM part of a compilation, for either target: the specialized module in an LLVM
    context of its own, the optimization pipeline, then `emit(module, tm)` (timed as `stage`,
    with the test-only fault `fault` before it). Returns what emit made and, with keep_ir, the
    optimized IR as it went to the backend. Module and context are closed here, on this thread,
    under the LLVM lock (the target machines are cached and shared under it), not whenever the
    collector gets to them."""
    import llvmlite.binding as llvm

    from . import ir  # llvmlite: only when compiling

    with LLVM_LOCK:
        pipeline.skip(cg.skip_passes)
        pipeline.unroll_threshold(cg.unroll_threshold)
        context = llvm.create_context()
        module = None
        try:
            t = time.perf_counter()
            module = ir.specialize_module(table, kernel, plan, context, found)
            timings["ir"] = ms_since(t)
            t = time.perf_counter()
            tm = target_machine()
            faults.check("optimize")
            pipeline.run(module, tm, pipeline.pipeline_text(cg.opt_level, cg.opt_pipeline),
                         pipeline.Tuning.from_cmdline(table.modules[kernel.module].cmdline))
            timings["optimize"] = ms_since(t)
            # taken before emit: the backend's own IR passes rewrite the module in place
            # (address spaces inferred, multiply-adds fused), and the IR asked for is the optimizer's
            ir_text = str(module) if keep_ir else None
            t = time.perf_counter()
            faults.check(fault)
            out = emit(module, tm)
            timings[stage] = ms_since(t)
            return out, ir_text
        finally:
            if module is not None:
                module.close()
            context.close()


@dataclass(frozen=True)
class Nvptx:
    """CUDA: PTX from LLVM's NVPTX backend (bitcode), or the kernel's own PTX specialized as text
    (the PTX code kind, ptx_route.py), then a cubin (nvJitLink or ptxas), or the PTX for the
    driver to compile. Variants are named `<kernel>$proteus$<key prefix>`, so profilers tell
    them from the original."""

    arch: int  # SM version

    platform = "cuda"  # as KernelTable.app.platform names it
    # the launch's block and grid reach the code (folded, as ranges, or as launch bounds), so
    # both may be in the shim's key
    folds_dims = True
    # CUDA's occupancy rules (occupancy.py) bound the variant's registers per thread
    caps_registers = True
    # what the shim does for this platform's variants beyond launching them: speed trials
    # (shim/trial.c, CUDA events), PROTEUS_VALIDATE's shadow run (shim/cuda_validate.c) and a
    # warm run's loading ahead (shim/cuda_warm.c)
    speed_trials = True
    validates = True
    loads_ahead = True

    def accepts(self, recorded_arch: int | str) -> bool:
        """Whether bitcode recorded for `recorded_arch` may be compiled for this device: any
        SM version (best_record chose it: an older one's bitcode compiles for a newer device)."""
        return True

    def best_record(self, records, code_kind: str = "auto"):
        """Which of a kernel's records (one per target it was built for) to specialize here:
        bitcode before PTX (PTX before bitcode with code_kind "ptx", bitcode alone with
        "bitcode"); the newest SM version not above the device's, else, for bitcode, the oldest
        above it (its bitcode still compiles for the device; PTX of a newer architecture does not
        assemble for an older GPU). None when none fits."""
        order = {"ptx": ("ptx", "bitcode"), "bitcode": ("bitcode",)}.get(code_kind, ("bitcode", "ptx"))
        for code in order:
            cuda = [k for k in records if k.specializable and k.code == code and isinstance(k.arch, int)]
            usable = [k for k in cuda if k.arch <= self.arch] or (cuda if code == "bitcode" else [])
            if usable:
                return max(usable, key=lambda k: k.arch if k.arch <= self.arch else -k.arch)
        return None

    def load_failure(self, code: int) -> str:
        return f"cuModuleLoadData/cuModuleGetFunction failed with CUDA error {code}"

    def adapt(self, plan: Plan, cg: CodegenConfig) -> tuple[Plan, CodegenConfig]:
        return plan, cg

    def key_target(self, cg: CodegenConfig, driver_version: int | None) -> tuple:
        # The PTX ISA is bounded by the driver that will load the code; asking the compiler its
        # version costs a library load, so that bound is applied only when something is compiled.
        return (("driver", codegen.driver_ptx_isa(driver_version)) if driver_version else
                ("compiler", codegen.ptx_isa_for(codegen.compiler_cuda_version(cg.ptx_compiler))))

    def isa(self, key_target: tuple) -> int | None:
        return key_target[1]

    def named(self, plan: Plan, kernel_name: str, key: str) -> Plan:
        return dataclasses.replace(plan, entry=variant_name(kernel_name, key))

    def from_cache(self, entry: Entry) -> codegen.Image | None:
        if entry.kind == "cubin":
            return codegen.Cubin(entry.data, entry.arch)
        return codegen.PTX(entry.data.rstrip(b"\0").decode(), entry.arch) if entry.kind == "ptx" else None

    def cache_kind(self, image: codegen.Image) -> str:
        return "cubin" if isinstance(image, codegen.Cubin) else "ptx"

    def compile(self, table, kernel, plan: Plan, cg: CodegenConfig, isa: int | None, keep_ir: bool,
                timings: dict[str, float]) -> Compiled:
        if table.modules[kernel.module].kind == "ptx":
            ptx, image, found = ptx_route.assemble(table, kernel, plan, cg, self.arch, isa, timings)
            ir_text = None
        else:
            ptx, image, ir_text, found = self._from_bitcode(table, kernel, plan, cg, isa, keep_ir, timings)
        if cg.occupancy_step and plan.max_registers and plan.max_threads and kernel.aot_registers:
            t = time.perf_counter()
            ptx, image = step_occupancy(ptx, image, plan, kernel.aot_registers, cg, self.arch, found)
            timings["step"] = ms_since(t)
        return Compiled(image, ptx, ir_text, found)

    def _from_bitcode(self, table, kernel, plan: Plan, cg: CodegenConfig, isa: int | None, keep_ir: bool,
                      timings: dict[str, float]):
        found = Findings()
        if cg.ptx_compiler != "driver":
            isa = min(isa, codegen.ptx_isa_for(codegen.compiler_cuda_version(cg.ptx_compiler)))
        codegen.fp_contraction(pipeline.Tuning.from_cmdline(table.modules[kernel.module].cmdline).fp_contract)
        ptx, ir_text = optimize_and_emit(table, kernel, plan, cg, keep_ir, timings,
                                         lambda: codegen.target_machine(self.arch, isa, cg.codegen_opt_level),
                                         lambda module, tm: codegen.emit_ptx(module, tm, self.arch), "ptx", "ptx", found)
        t = time.perf_counter()
        faults.check("cubin")
        image = codegen.compile_ptx(ptx, cg.ptx_compiler, cg.codegen_opt_level)
        timings["cubin"] = ms_since(t)
        return ptx, image, ir_text, found


@dataclass(frozen=True)
class Amdgpu:
    """HIP: an object from LLVM's AMDGPU backend for the device's processor, linked by ld.lld
    into a code object. No CUDA tool is asked anything: the key names the linker where CUDA's
    names the PTX compiler. A HIP variant keeps the kernel's name (a code object is looked up by
    it). Block and grid sizes are not folded (ir.py), so only the launch bound (the flat
    work-group size, from the block) reaches the code and the key: any grid shares a variant."""

    arch: str  # processor, "gfx90a" (no features: target_for drops them)

    platform = "hip"
    folds_dims = False  # only the block reaches the code, as the flat work-group size (adapt)
    caps_registers = False
    # the HIP shim has no speed trials, no shadow run and no loading ahead
    speed_trials = False
    validates = False
    loads_ahead = False

    def accepts(self, recorded_arch: int | str) -> bool:
        """A module built for one processor (its target attributes, the device libraries linked
        into it) runs on no other."""
        return recorded_arch == self.arch

    def best_record(self, records, code_kind: str = "auto"):
        """The record built for this processor, with bitcode; None when there is none."""
        return next((k for k in records if k.has_bitcode and k.arch == self.arch), None)

    def load_failure(self, code: int) -> str:
        return f"hipModuleLoadData/hipModuleGetFunction failed with HIP error {code}"

    def adapt(self, plan: Plan, cg: CodegenConfig) -> tuple[Plan, CodegenConfig]:
        return (dataclasses.replace(plan, grid=None, fold_dims=False, dims_range=False, min_ctas=None,
                                    block=plan.block if plan.max_threads else None),
                dataclasses.replace(cg, ptx_compiler="ld.lld"))

    def key_target(self, cg: CodegenConfig, driver_version: int | None) -> tuple:
        return ("amdgpu",)

    def isa(self, key_target: tuple) -> int | None:
        return None

    def named(self, plan: Plan, kernel_name: str, key: str) -> Plan:
        return plan

    def from_cache(self, entry: Entry) -> codegen.Image | None:
        return codegen.CodeObject(entry.data, entry.arch) if entry.kind == "codeobj" else None

    def cache_kind(self, image: codegen.Image) -> str:
        return "codeobj"

    def compile(self, table, kernel, plan: Plan, cg: CodegenConfig, isa: int | None, keep_ir: bool,
                timings: dict[str, float]) -> Compiled:
        found = Findings()
        obj, ir_text = optimize_and_emit(table, kernel, plan, cg, keep_ir, timings,
                                         lambda: codegen.amdgpu_target_machine(self.arch, cg.codegen_opt_level),
                                         codegen.emit_amdgpu_object, "codeobj", "object", found)
        t = time.perf_counter()
        image = codegen.link_code_object(obj, self.arch)
        timings["link"] = ms_since(t)
        return Compiled(image, None, ir_text, found)


Target = Nvptx | Amdgpu


def target_for(arch: int | str) -> Target:
    """An SM version (90) is CUDA's NVPTX; a processor name is HIP's AMDGPU, its features
    dropped (the device's gcnArchName "gfx90a:sramecc+:xnack-" is "gfx90a"). TypeError for
    anything else, so that a malformed document's architecture is refused, not compiled for."""
    if isinstance(arch, str):
        return Amdgpu(arch.split(":", 1)[0])
    if isinstance(arch, int):
        return Nvptx(arch)
    raise TypeError(f"not a GPU architecture: {arch!r}")


def best_record(records, arch: int | str, code_kind: str = "auto"):
    """Which of a kernel's records to specialize for a device of `arch` (the target says;
    code_kind: PROTEUS_CODE_KIND)."""
    return target_for(arch).best_record(records, code_kind)


def document_arch(value: object) -> int | str:
    """An architecture as a JSON document holds it (a report's launch record): a processor
    name as it is, anything else read as an SM version (ValueError or TypeError when it is
    none)."""
    return value if isinstance(value, str) else int(value)  # type: ignore[arg-type]


# A variant tried at one more block per SM is kept when ptxas fits it in at most this many bytes
# of stack per thread more than the variant at the AOT occupancy, and the registers it must shed
# are at most this share of what it used. HeCBench rsbench's lookup (LLVM 22: 151 registers, one
# block of 256 per SM, as the AOT code's 130) fits two blocks at 128 with 48 more bytes.
STEP_MAX_STACK_GROWTH = 64
STEP_MAX_REGISTER_CUT = 0.2
# Spilling is worth it only for a large gain in residency: at least this factor more blocks per
# SM (1 -> 2, 2 -> 3); a smaller gain is taken only where nothing more spills. A step from 1 to 2
# blocks that spilled still made the kernel faster; steps of one block in four or six, spilling
# as little, made theirs slower (docs/dev/findings.md, "Spilling for residency pays only for a
# large gain"). Timing both variants on live launches would decide per kernel; the speed trials
# time one against the AOT code.
STEP_SPILL_MIN_GAIN = 1.5


def step_occupancy(ptx: codegen.PTX, image, plan: Plan, aot_registers: int, cg: CodegenConfig, arch: int,
                   found: Findings):
    """The variant at one more resident block per SM than the AOT code, where that costs little
    spilling; otherwise the variant as compiled. LLVM 22's code needs more registers than clang
    19's for some kernels (rsbench's lookup 151 or more where LLVM 19's fits 128), and upstream
    Proteus, LLVM 19 throughout, then runs at twice the AOT code's residency."""
    threads = plan.max_threads[0] * plan.max_threads[1] * plan.max_threads[2]
    entry = plan.entry or ""
    try:
        first = cubin_format.resources(image.data).get(entry)
    except Exception:  # noqa: BLE001  the image loads or not on its own; this is only a second try
        return ptx, image
    if first is None or first.registers is None or first.stack is None:
        return ptx, image
    level = occupancy.blocks_per_sm(first.registers, threads, arch)
    aot_level = occupancy.blocks_per_sm(aot_registers, threads, arch)
    if level is None or aot_level is None or level > aot_level:
        return ptx, image
    budget = occupancy.register_budget_for(aot_level + 1, threads, arch)
    if budget is None or budget < first.registers * (1 - STEP_MAX_REGISTER_CUT):
        return ptx, image
    stepped_text, n = re.subn(r"^(\s*)\.maxnreg \d+", rf"\g<1>.maxnreg {budget}", ptx.text, count=1, flags=re.M)
    if not n:
        return ptx, image
    stepped_ptx = codegen.PTX(stepped_text, ptx.arch)
    try:
        stepped = codegen.compile_ptx(stepped_ptx, cg.ptx_compiler, cg.codegen_opt_level)
        second = cubin_format.resources(stepped.data).get(entry)
    except Exception:  # noqa: BLE001
        return ptx, image
    max_growth = STEP_MAX_STACK_GROWTH if aot_level + 1 >= STEP_SPILL_MIN_GAIN * level else 0
    if second is None or second.stack is None or second.stack - first.stack > max_growth:
        found.notes.append(f"kept {first.registers} registers: at {budget} for {aot_level + 1} blocks per SM "
                           f"it needs {second.stack if second else '?'} bytes of stack per thread, not {first.stack}")
        return ptx, image
    found.notes.append(f"{second.registers} registers, {aot_level + 1} blocks per SM (the AOT code: {aot_level}), "
                       f"stack {first.stack} -> {second.stack} bytes per thread")
    return stepped_ptx, stepped
