"""Specialized IR for one launch: recorded bitcode + launch values -> an LLVM module whose
only kernel has the original name and signature.

The technique (verified with llvmlite 0.50 / LLVM 22; AMDGPU modules take the same road,
with the amdgpu_kernel calling convention and "amdgpu-flat-work-group-size" for the bound): the original kernel becomes an
internal, always-inline function `__proteus_impl`, and a new kernel with the original name
and parameter list calls it, passing constants for the folded arguments. After inlining,
O3 sees the constants everywhere. Block and grid sizes are folded the same way: the
`llvm.nvvm.read.ptx.sreg.ntid/nctaid` intrinsics are renamed to functions the wrapper
defines as constants. Device variables (`__device__`, `__constant__`) are not copied: every
use goes through a pointer to the AOT module's variable (relink.py), so JIT and AOT kernels
share the same memory.

llvmlite's structured API does the renames, linkage changes, attributes and dead-code
pruning. Three edits it cannot make are done on LLVM's own printout of the (already
pruned, single-kernel) module, each confined to lines this module itself produced:
dropping the `ptx_kernel` calling convention from `__proteus_impl`'s `define` line, the
device-variable redirection, and appending the wrapper and the dimension functions.
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm

from .. import faults
from ..errors import SpecializeError
from ..fatbin import bitcode as bitcode_mod
from ..fatbin.table import KernelRecord, KernelTable
from . import relink
from .plan import Findings, Plan

IMPL = "__proteus_impl"
# Function attributes the wrapper kernel takes over from the original: its target, and the
# floating-point semantics it was compiled under (-fcuda-flush-denormals-to-zero, -ffast-math
# and the like arrive as these, not as command-line options): after inlining, the wrapper's
# attributes are the ones code generation reads. Launch bounds are the plan's; memory effects
# are left for LLVM to infer again (redirected device variables are no longer what they say).
KEPT_ATTRS = ("target-cpu", "target-features", "uniform-work-group-size", "denormal-fp-math",
              "denormal-fp-math-f32", "no-trapping-math", "unsafe-fp-math", "no-infs-fp-math", "no-nans-fp-math",
              "no-signed-zeros-fp-math", "approx-func-fp-math", "less-precise-fpmad")
# AMDGPU also keeps what the original was compiled under; the amdgpu-no-* facts are left for the
# backend's attributor to find again, and the flat work-group size is the launch's own.
AMDGPU_KEPT_ATTRS = KEPT_ATTRS + ("amdgpu-waves-per-eu", "amdgpu-unsafe-fp-atomics")
# What keeps a function from being inlined: the original kernel may carry them
# (`__global__ __attribute__((noinline))`, as upstream Proteus's daxpy test declares it), and
# the verifier refuses them next to alwaysinline.
NOT_INLINABLE = ("noinline", "optnone")
SREG_PREFIX = "llvm.nvvm.read.ptx.sreg."
SREG_RENAMED = "__proteus_sreg_"
_BARE_NAME = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*")


def llvm_name(name: str) -> str:
    """How LLVM prints a global's name: bare, or quoted with \\XX escapes."""
    if _BARE_NAME.fullmatch(name):
        return "@" + name
    escaped = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else f"\\{ord(c):02X}" for c in name)
    return f'@"{escaped}"'


def load_module(table: KernelTable, kernel: KernelRecord, context: llvm.ContextRef | None = None) -> llvm.ModuleRef:
    """The kernel's translation unit, linked with the other units it needs (-fgpu-rdc)."""
    if kernel.module is None:
        raise SpecializeError(f"{kernel.demangled}: no bitcode was recorded for this kernel")
    module = bitcode_mod.parse(table.modules[kernel.module].code, context)
    for i in kernel.link_modules:
        try:
            module.link_in(bitcode_mod.parse(table.modules[i].code, context))
        except RuntimeError as exc:
            raise SpecializeError(f"{kernel.demangled}: linking translation unit {i} failed: {exc}") from None
    return module


def specialize_module(table: KernelTable, kernel: KernelRecord, plan: Plan,
                      context: llvm.ContextRef | None = None, found: Findings | None = None) -> llvm.ModuleRef:
    """The specialized module, in `context` (the caller's, to close when done; None: LLVM's global
    one); what it found goes into `found`."""
    module = load_module(table, kernel, context)
    try:
        return _specialize(module, table, kernel, plan, context, found if found is not None else Findings())
    finally:
        module.close()  # now, not whenever the garbage collector runs, perhaps in another thread


def _specialize(module: llvm.ModuleRef, table: KernelTable, kernel: KernelRecord, plan: Plan,
                context: llvm.ContextRef | None, found: Findings) -> llvm.ModuleRef:
    try:
        fn = module.get_function(kernel.name)
    except NameError:
        raise SpecializeError(f"{kernel.demangled}: the bitcode does not define {kernel.name}") from None
    params = _param_texts(str(fn), kernel.name)
    amdgpu = module.triple.startswith("amdgcn")
    kept = _kept_attributes(fn, AMDGPU_KEPT_ATTRS if amdgpu else KEPT_ATTRS)
    if len(params) != len(kernel.params):
        raise SpecializeError(f"{kernel.demangled}: bitcode has {len(params)} parameters, the store {len(kernel.params)}")

    # Structured part: keep only what this kernel reaches, under names we control.
    for f in module.functions:
        if not f.is_declaration and f.name != kernel.name:
            f.linkage = llvm.Linkage.internal
    for g in module.global_variables:
        if not g.is_declaration and g.name not in plan.globals:
            g.linkage = llvm.Linkage.internal  # also llvm.used/compiler.used/global.annotations: pruned below
    fn.name = IMPL
    renamed = []
    for f in module.functions:
        if f.is_declaration and f.name.startswith(SREG_PREFIX) and _wants_sreg(f.name[len(SREG_PREFIX):], plan):
            reg = f.name[len(SREG_PREFIX):]
            f.name = SREG_RENAMED + reg.replace(".", "_")
            renamed.append(reg)
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    pm.add_sroa_pass()  # uninitialized locals become undef values, which define_undefined() finds
    pm.run(module, llvm.create_pass_builder(any_target_machine(), llvm.create_pipeline_tuning_options()))
    fn.linkage = llvm.Linkage.internal  # only now: unreferenced until the wrapper exists, DCE would drop it

    # Textual part, on LLVM's printout of the pruned module.
    text = str(module)
    for reg in renamed:  # the calls that read a folded register, as upstream's [DimSpec] lines count them
        callee = re.escape(llvm_name(SREG_RENAMED + reg.replace(".", "_")))
        found.sreg_calls[SREG_PREFIX + reg] = len(re.findall(r"call[^\n]*" + callee + r"\(", text))
    text = _drop_kernel_cc(text)
    text = _make_inlinable(text)
    text, undefined = define_undefined(text)
    if undefined:
        found.notes.append(f"{undefined} undefined value{'s' if undefined > 1 else ''} (uninitialized locals, or undef in the "
                     "recorded code) defined as zero")
    if plan.relink_globals:
        text = relink.load_through_pointers(text, sorted(plan.globals), kernel.demangled,
                                            lambda n: re.escape(llvm_name(n)) + r"(?![-\w$.])", amdgpu)
    text = _drop_declarations(text, [SREG_RENAMED + r.replace(".", "_") for r in renamed])
    text += _amdgpu_wrapper(kernel, params, plan, kept) if amdgpu else _wrapper(kernel, params, plan, renamed, kept)
    try:
        result = llvm.parse_assembly(text, context)
    except RuntimeError as exc:
        raise SpecializeError(f"{kernel.demangled}: the specialized module does not parse: {_first_line(exc)}") from None
    try:
        result.verify()
    except RuntimeError as exc:
        result.close()
        raise SpecializeError(f"{kernel.demangled}: the specialized module does not verify: {_first_line(exc)}") from None
    # Inline the original body into the new kernel now, so that any pipeline (a user's
    # PROTEUS_OPT_PIPELINE need not inline) optimizes the kernel with its constants in place.
    pm = llvm.create_new_module_pass_manager()
    pm.add_always_inliner_pass()
    pm.add_global_dead_code_eliminate_pass()
    pm.run(result, llvm.create_pass_builder(any_target_machine(), llvm.create_pipeline_tuning_options()))
    return result


def _wants_sreg(reg: str, plan: Plan) -> bool:
    kind = reg.split(".")[0]
    if (plan.block if kind in ("ntid", "tid") else plan.grid) is None:
        return False
    if kind in ("ntid", "nctaid"):
        return plan.fold_dims or plan.dims_range
    if kind in ("tid", "ctaid"):
        return plan.dims_range
    return False


_TARGET_MACHINE = None


def any_target_machine() -> llvm.TargetMachine:
    """GlobalDCE needs a pass builder, which needs some target machine; which one does not matter."""
    global _TARGET_MACHINE  # a cache that says so: target machines are expensive to make
    if _TARGET_MACHINE is None:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _TARGET_MACHINE = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(cpu="sm_90")
    return _TARGET_MACHINE


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _split_top_level(text: str) -> list[str]:
    """Split a parameter list at commas outside (), [], {}, <> and quotes."""
    parts, depth, quote, start = [], 0, False, 0
    for i, c in enumerate(text):
        if c == '"':
            quote = not quote
        elif quote:
            continue
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _param_texts(fn_text: str, name: str) -> list[str]:
    """Each parameter's type and attributes, as printed (without its %name)."""
    token = llvm_name(name) + "("
    start = fn_text.find(token, fn_text.find("define"))
    if start < 0:
        raise SpecializeError(f"{name}: cannot find its definition in the module printout")
    pos = start + len(token)
    depth, quote = 1, False
    for i in range(pos, len(fn_text)):
        c = fn_text[i]
        if c == '"':
            quote = not quote
        elif not quote and c == "(":
            depth += 1
        elif not quote and c == ")":
            depth -= 1
            if depth == 0:
                break
    else:
        raise SpecializeError(f"{name}: unbalanced parameter list")
    out = []
    for p in _split_top_level(fn_text[pos:i]):
        words = p.rsplit(" ", 1)
        out.append(words[0] if len(words) == 2 and words[1].startswith("%") else p)
    return out


def _drop_kernel_cc(text: str) -> str:
    pattern = re.compile(r"^(define [^\n]*?)\b(?:ptx_kernel|amdgpu_kernel) (?=[^\n]*" + re.escape(llvm_name(IMPL)) + r"\()", re.M)
    text, n = pattern.subn(r"\1", text, count=1)
    if n != 1:
        raise SpecializeError("internal: the kernel's define line was not found")
    return text


_UNDEFINED = re.compile(r"\b(undef|poison)\b")


def define_undefined(text: str) -> tuple[str, int]:
    """Every `undef`/`poison` operand in a function body becomes zero; returns the text and how
    many were replaced.

    A kernel that reads a local it never wrote (HeCBench wsm5 reads its accumulators fallc_k
    and fallc_kp1 before their first assignment) has undefined behaviour, which LLVM keeps as
    `undef`: SROA (run just before this) turns such reads into undef values, and a post-
    optimization module already holds them as `phi [undef, ...]`. Every compiler may then pick
    any value, and each pick can be a different one: clang 19's for the AOT code happened to
    give the program its expected answer, LLVM 22 folding launch values into the same code gave
    another (rain 1295467 instead of 2.759990). Zero is what -ftrivial-auto-var-init=zero
    gives and what the AOT code behaved as; choosing it is a refinement (a program without
    undefined behaviour cannot tell). shufflevector masks are left alone: an undefined lane
    there selects nothing."""
    count = 0
    out = []
    in_body = False
    for line in text.splitlines(keepends=True):
        if line.startswith("define "):
            in_body = True
        elif line.startswith("}"):
            in_body = False
        elif in_body and "shufflevector" not in line and ("undef" in line or "poison" in line):
            line, n = _UNDEFINED.subn("zeroinitializer", line)
            count += n
        out.append(line)
    return "".join(out), count


def _drop_declarations(text: str, names: list[str]) -> str:
    for n in names:
        text = re.sub(r"^declare [^\n]*" + re.escape(llvm_name(n)) + r"\([^\n]*\n", "", text, count=1, flags=re.M)
    return text


def _kept_attributes(fn, kept: tuple[str, ...]) -> list[str]:
    attrs = bitcode_mod._STRATTR.findall(" ".join(a.decode("utf-8", "replace") for a in fn.attributes))
    return [f'"{k}"="{v}"' for k, v in attrs if k in kept]


def _make_inlinable(text: str) -> str:
    """`__proteus_impl` gets alwaysinline, and loses noinline and optnone: on its define line,
    its attribute group is replaced by a copy of its own (another function may share it)."""
    m = re.search(r"^define [^\n]*" + re.escape(llvm_name(IMPL)) + r"\([^\n]*$", text, re.M)
    if m is None:
        raise SpecializeError("internal: the kernel's define line was not found")
    line = m.group(0)
    ref = re.search(r" (#\d+)(?=[^\n]*\{$)", line)
    attrs = ""
    if ref:
        g = re.search(r"^attributes " + ref.group(1) + r" = \{ (.*) \}$", text, re.M)
        attrs = g.group(1) if g else ""
    words = [w for w in re.findall(r'"[^"]*"(?:="[^"]*")?|\w+(?:\([^)]*\))?', attrs) if w not in NOT_INLINABLE]
    groups = [int(n) for n in re.findall(r"^attributes #(\d+) =", text, re.M)]
    group = f"#{1 + max(groups, default=0)}"
    line = line[:ref.start(1)] + group + line[ref.end(1):] if ref else line[:-2] + f" {group} {{"
    return text[:m.start()] + line + text[m.end():] + f"\nattributes {group} = {{ {' '.join(['alwaysinline'] + words)} }}\n"


def _constant(plan: Plan, i: int) -> str:
    """The folded argument's IR constant; the test-only fault wrong-code (faults.py) makes the
    last folded integer one larger, a variant whose results differ, for validation's tests (the
    last: a kernel's first integers tend to be sizes, and a size one larger writes out of bounds)."""
    text = plan.folded[i]
    if faults.active("wrong-code"):
        ints = [j for j, t in plan.folded.items() if re.fullmatch(r"-?\d+", t)]
        if ints and i == max(ints):
            return str(int(text) + 1)
    return text


def _amdgpu_wrapper(kernel: KernelRecord, params: list[str], plan: Plan, kept: list[str]) -> str:
    """The AMDGPU kernel: amdgpu_kernel calling convention; the launch bound is the flat
    work-group size "1,N" (N threads per block), never above a declared __launch_bounds__."""
    decls, args = [], []
    for i, ptext in enumerate(params):
        align = plan.alignment.get(i)
        decl = ptext if not align or re.search(r"\balign \d+", ptext) else f"{ptext} align {align}"
        decls.append(f"{decl} %a{i}")
        args.append(f"{ptext} {_constant(plan, i)}" if i in plan.folded else f"{ptext} %a{i}")
    attrs = list(kept)
    if plan.max_threads:
        threads = plan.max_threads[0] * plan.max_threads[1] * plan.max_threads[2]
        attrs.append(f'"amdgpu-flat-work-group-size"="1,{threads}"')
    elif kernel.max_threads:
        attrs.append(f'"amdgpu-flat-work-group-size"="1,{kernel.max_threads[0] * kernel.max_threads[1] * kernel.max_threads[2]}"')
    return "\n".join([
        "",
        f"define amdgpu_kernel void {llvm_name(kernel.name)}({', '.join(decls)}) {' '.join(attrs)} {{",
        f"  call void {llvm_name(IMPL)}({', '.join(args)})",
        "  ret void",
        "}",
    ]) + "\n"


# The test-only fault slow-code (faults.py): every thread spins 200,000 clock cycles (about 0.1 ms)
# before the kernel's work, a variant slower than the original for the speed trials' tests.
SLOW_CODE = ('  call void asm sideeffect "{ .reg .u64 %t0, %t1; .reg .pred %p; mov.u64 %t0, %clock64; '
             'PROTEUS_SLOW: mov.u64 %t1, %clock64; sub.u64 %t1, %t1, %t0; setp.lt.u64 %p, %t1, 200000; '
             '@%p bra PROTEUS_SLOW; }", ""()')


def _wrapper(kernel: KernelRecord, params: list[str], plan: Plan, renamed: list[str], kept: list[str]) -> str:
    decls, args = [], []
    for i, ptext in enumerate(params):
        align = plan.alignment.get(i)
        decl = ptext if not align or re.search(r"\balign \d+", ptext) else f"{ptext} align {align}"
        decls.append(f"{decl} %a{i}")
        args.append(f"{ptext} {_constant(plan, i)}" if i in plan.folded else f"{ptext} %a{i}")
    attrs = list(kept)
    if plan.max_threads:
        attrs.append('"nvvm.maxntid"="{},{},{}"'.format(*plan.max_threads))
        attrs.append(f'"nvvm.minctasm"="{plan.min_ctas or 1}"')
    if plan.max_registers:
        attrs.append(f'"nvvm.maxnreg"="{plan.max_registers}"')
    lines = [
        "",
        f"define ptx_kernel void {llvm_name(plan.entry or kernel.name)}({', '.join(decls)}) {' '.join(attrs)} {{",
        *([SLOW_CODE] if faults.active("slow-code") else []),
        f"  call void {llvm_name(IMPL)}({', '.join(args)})",
        "  ret void",
        "}",
    ]
    for reg in renamed:
        kind, axis = reg.split(".")
        value = {"ntid": plan.block, "nctaid": plan.grid}.get(kind)
        fname = llvm_name(SREG_RENAMED + reg.replace(".", "_"))
        if value is not None and plan.fold_dims:
            body = f"  ret i32 {value['xyz'.index(axis)]}"
        else:
            bound = {"tid": plan.block, "ctaid": plan.grid, "ntid": plan.block, "nctaid": plan.grid}[kind]["xyz".index(axis)]
            lo, hi = (1, bound + 1) if kind in ("ntid", "nctaid") else (0, bound)
            body = f"  %v = call range(i32 {lo}, {hi}) i32 @{SREG_PREFIX}{reg}()\n  ret i32 %v"
            lines.append(f"declare i32 @{SREG_PREFIX}{reg}()")
        lines += [f"define internal i32 {fname}() alwaysinline {{", body, "}"]
    return "\n".join(lines) + "\n"
