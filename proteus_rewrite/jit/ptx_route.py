"""The PTX code kind: a kernel recorded with no bitcode (an nvcc build) specialized from the PTX
its fat binary carries beside the SASS, then assembled by ptxas or nvJitLink.

What LLVM does for the bitcode route is done here on the PTX text, and the assembler's own
optimizer (constant propagation, dead branches, unrolling of small constant trip counts) does
the rest. Each step keeps the kernel's signature, so the launch's own parameter buffer is
passed to the variant unchanged:
  prune      the entry and the functions it calls; the variables they name
  rename     the variant's entry point (`<kernel>$proteus$<key>`)
  fold       `ld.param` of a folded parameter (an integer, or an integer part of a by-value
             aggregate) becomes a `mov` of the launch's bytes; floating-point values stay
             loads (jit/launch.py foldable says why); a parameter whose address the kernel
             takes was recorded unfoldable (fatbin/ptx.py)
  dims       `%ntid`/`%nctaid` read by `mov` become the launch's block and grid
  bounds     `.reqntid` (dims folded) or `.maxntid`, `.minnctapersm`, `.maxnreg`
  variables  each device variable is reached through a pointer set in the image as it is
             loaded (relink.py), as on the bitcode route: `[var+8]` becomes `[%pgv0+8]`,
             `ld.const` becomes `ld.global` (a `__constant__` lives in global memory)
  divide     exact strength reductions ptxas does not make (ptx_divide.py)
  keep       a product of two constants that the AOT code fused into an add stays fused; an
             approximate instruction of constants is still run by the hardware (ptx_contract.py)
The evidence for what ptxas does and does not do is in docs/dev/findings/ptx-route.md.
"""

from __future__ import annotations

import re
import time

from .. import faults
from ..errors import FormatError, SpecializeError
from ..fatbin import ptx as ptx_format
from . import codegen, ptx_contract, ptx_divide
from .plan import Findings, Plan
from .relink import PLACEHOLDER, pointer_name

# Raised with every change that can change the code made from the same inputs (the cache key
# names it, so that entries an earlier version wrote are not served).
REVISION = 4

_REG_DECL = re.compile(r"^\s*\.reg\s+\.(\w+)\s+(%[\w$]+?)(?:<(\d+)>)?\s*(?:,[^;]*)?;", re.M)
_LD_PARAM = re.compile(r"^(\s*)ld\.param(?:\.v(\d))?\.(\w+)\s+(\{[^}]*\}|%[\w$]+)\s*,\s*\[([\w$.]+)(?:\s*\+\s*(\d+))?\]\s*;[ \t]*$",
                       re.M)
_SREG_MOV = re.compile(r"^(\s*mov\.[usb]32\s+%[\w$]+\s*,\s*)%(ntid|nctaid)\.([xyz])(\s*;)", re.M)
_BOUNDS = re.compile(r"\s*\.(?:maxntid|reqntid|minnctapersm|maxnreg)\b[^.{]*")
_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.M)
_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def specialize_text(table, kernel, plan: Plan, found: Findings) -> str:
    """The specialized PTX module for `kernel` under `plan` (see the module's docstring)."""
    source = table.modules[kernel.module].code.decode("utf-8", "replace")
    try:
        module = ptx_format.items(ptx_format.strip_comments(source))
    except FormatError as exc:
        raise SpecializeError(f"{kernel.demangled}: its PTX cannot be read: {exc.message}") from None
    kept = ptx_format.reached(module, kernel.name)
    if all(f.name != kernel.name for f in kept):
        raise SpecializeError(f"{kernel.demangled}: its PTX does not define the entry {kernel.name}")
    variables = ptx_format.variables_used(module, kept)
    for v in variables:
        if re.search(r"\.(?:texref|surfref|samplerref)\b", v.text):
            raise SpecializeError(f"{kernel.demangled}: uses texture reference {v.name} (not specialized from PTX)")
        init = v.text.partition("=")[2]
        if re.search(r"(?<![\w$.])[A-Za-z_$][\w$.]*", init.replace("generic", "")):
            # a table of addresses (a vtable, function pointers): they would be the variant
            # module's, or the AOT module's through the redirected copy; neither is safe to call
            raise SpecializeError(f"{kernel.demangled}: device variable {v.name} holds addresses "
                                  "(function pointers or a vtable); not specialized from PTX")
    redirected = sorted(plan.globals) if plan.relink_globals else []
    missing = [v.name for v in variables if plan.relink_globals and v.name not in plan.globals]
    if missing:
        raise SpecializeError(f"{kernel.demangled}: the address of device variable(s) {', '.join(missing)} is unknown")
    calls = set().union(*(ptx_format.callees(f) for f in kept))
    kept_names = {f.name for f in kept}
    used = {v.name for v in variables}
    counts = dict.fromkeys(_NOTES, 0)
    out = []
    for it in module:
        if it.kind == "function" and it.name in kept_names:
            out.append(_function(it, kernel, plan, redirected, found, counts))
        elif (it.kind == "prototype" and it.name in calls) or it.kind == "directive":
            out.append(it.text)
        elif it.kind == "variable" and it.name in used and it.name not in redirected:
            out.append(it.text)
    found.notes.extend(note.format(n) for note, n in counts.items() if n)
    if redirected:  # declared before the first function: PTX names nothing before its declaration
        first = next(i for i, s in enumerate(out) if re.match(r"\s*(?:\.(?:visible|weak|extern)\s+)*\.(?:entry|func)\b", s))
        out.insert(first, "".join(f".visible .global .align 8 .u64 {pointer_name(i)} = {PLACEHOLDER};\n"
                                  for i, _name in enumerate(redirected)))
    text = "\n".join(s.strip("\n") for s in out) + "\n"
    leftover = [v for v in redirected if re.search(r"(?<![\w$.%])" + re.escape(v) + r"(?![\w$.])", text)]
    if leftover:
        raise SpecializeError(f"{kernel.demangled}: device variable {leftover[0]} is used in a form that cannot be "
                              "redirected (an initializer holds its address)")
    return text


# what the exact rewrites did, for the report: format -> count over the kept functions
_NOTES = ("{} division(s) by a constant rewritten exactly", "{} product(s) of constants kept fused into their add",
          "{} approximate instruction(s) of constants left to the hardware")


def _function(it, kernel, plan: Plan, redirected: list[str], found: Findings, counts: dict[str, int]) -> str:
    """One kept function, specialized: the entry's signature and parameters, then in every
    function the dims, the device variables and the exact rewrites."""
    head, body, tail = it.text[: it.body[0]], ptx_format.body(it), it.text[it.body[1]:]
    if it.name == kernel.name:
        head = _entry_head(head, kernel.name, plan)
        body = _fold_params(body, kernel, plan, _declared(body))
    body = _fold_dims(body, plan, found)
    body = _redirect(body, redirected, kernel.demangled)
    for note, rewrite in zip(_NOTES, (ptx_divide.rewrite_divisions, ptx_contract.keep_contraction,
                                      ptx_contract.keep_approximations)):
        body, n = rewrite(body)
        counts[note] += n
    return head + body + tail


def assemble(table, kernel, plan: Plan, cg, arch: int, isa: int | None, timings: dict[str, float]):
    """The specialized text, then the PTX compiler: (PTX, image, findings)."""
    found = Findings()
    t = time.perf_counter()
    faults.check("optimize")
    text = specialize_text(table, kernel, plan, found)
    version = _VERSION.search(text)
    if version is not None and isa is not None:
        wanted = int(version.group(1)) * 10 + int(version.group(2))
        readable = isa if cg.ptx_compiler == "driver" else min(
            isa, codegen.ptx_isa_for(codegen.compiler_cuda_version(cg.ptx_compiler)))
        if wanted > readable:
            raise SpecializeError(
                f"{kernel.demangled}: its PTX is ISA {wanted // 10}.{wanted % 10}, newer than this run's assembler "
                f"reads ({readable // 10}.{readable % 10}): install a newer nvJitLink (pip) or CUDA toolkit, or a "
                "newer driver")
    timings["ptx"] = _ms_since(t)
    t = time.perf_counter()
    faults.check("cubin")
    ptx = codegen.PTX(text, arch)
    image = codegen.compile_ptx(ptx, cg.ptx_compiler, cg.codegen_opt_level)
    timings["cubin"] = _ms_since(t)
    return ptx, image, found


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _declared(body: str) -> dict[str, str]:
    """Register name (or name prefix, for `%r<16>`) -> its declared type."""
    return {m.group(2): m.group(1) for m in _REG_DECL.finditer(body)}


def _register_type(name: str, declared: dict[str, str]) -> str | None:
    if name in declared:
        return declared[name]
    prefix = re.match(r"(%[A-Za-z_$]+)\d+$", name)
    return declared.get(prefix.group(1)) if prefix else None


def _entry_head(head: str, name: str, plan: Plan) -> str:
    """The entry's signature under the variant's name, with its launch bounds."""
    if plan.entry:
        head = re.sub(r"(\.entry\s+)" + re.escape(name) + r"(?![\w$.])", lambda m: m.group(1) + plan.entry, head, count=1)
    if plan.max_threads is None and plan.min_ctas is None and plan.max_registers is None:
        return head
    close = head.rfind(")")
    params, directives = head[: close + 1], head[close + 1:]
    keep = [] if plan.max_threads else re.findall(r"\.(?:maxntid|reqntid)\s+[\d\s,]+", directives)
    directives = _BOUNDS.sub("", directives)
    lines = [k.strip() for k in keep]
    if plan.max_threads:
        bounds = plan.block if (plan.fold_dims and plan.block) else plan.max_threads
        word = "reqntid" if (plan.fold_dims and plan.block) else "maxntid"
        lines.append(f".{word} {bounds[0]}, {bounds[1]}, {bounds[2]}")
    if plan.min_ctas:
        lines.append(f".minnctapersm {plan.min_ctas}")
    if plan.max_registers:
        lines.append(f".maxnreg {plan.max_registers}")
    return params + "\n" + "\n".join(lines) + "\n" + directives.lstrip()


def _fold_params(body: str, kernel, plan: Plan, declared: dict[str, str]) -> str:
    """Each `ld.param` of a folded parameter as `mov`s of the launch's bytes."""
    by_name = {}
    for p in kernel.params:
        if p.index in plan.folded:
            by_name[f"{kernel.name}_param_{p.index}"] = (p, bytes.fromhex(plan.folded[p.index]))

    def fold(m: re.Match) -> str:
        indent, vec, ptype, dests, name, off = m.groups()
        if name not in by_name:
            return m.group(0)
        p, raw = by_name[name]
        size = _SIZES.get(re.sub(r"\D", "", ptype))
        if size is None:
            return m.group(0)
        regs = [d.strip() for d in dests.strip("{}").split(",")] if vec else [dests.strip()]
        base = int(off or 0)
        if p.kind != "float" and (ptype.startswith("f") or any(_register_type(r, declared) in ("f16", "f32", "f64")
                                                                  for r in regs)):
            return m.group(0)  # a struct's floating-point part stays a load (foldable() says why)
        moves = []
        for i, reg in enumerate(regs):
            at = base + i * size
            if reg == "_":
                continue
            if at + size > len(raw):
                raise SpecializeError(f"{kernel.demangled}: PTX reads {name}+{at} past the parameter's {len(raw)} bytes")
            rtype = _register_type(reg, declared)
            if rtype is None:
                raise SpecializeError(f"{kernel.demangled}: register {reg} is not declared")
            moves.append(f"{indent}mov.{_mov_type(rtype)} {reg}, {_immediate(raw[at:at + size], ptype, rtype)};")
        return "\n".join(moves)

    return _LD_PARAM.sub(fold, body)


def _mov_type(rtype: str) -> str:
    if rtype in ("f32", "f64"):
        return rtype
    bits = re.sub(r"\D", "", rtype)
    return f"b{bits}" if bits in ("16", "32", "64") else rtype


def _immediate(raw: bytes, ptype: str, rtype: str) -> str:
    """The PTX literal of a parameter's bytes as `ld.param.<ptype>` puts them in a register of
    type `rtype`: sign- or zero-extended to the register's width."""
    if rtype == "f32":
        return f"0f{int.from_bytes(raw[:4], 'little'):08X}"
    if rtype == "f64":
        return f"0d{int.from_bytes(raw[:8], 'little'):016X}"
    width = int(re.sub(r"\D", "", rtype) or 0)
    if width not in (16, 32, 64):
        raise SpecializeError(f"cannot fold a parameter into a .{rtype} register")
    value = int.from_bytes(raw, "little", signed=ptype.startswith("s"))
    return f"0x{value & ((1 << width) - 1):X}"


def _fold_dims(body: str, plan: Plan, found: Findings) -> str:
    if not plan.fold_dims:
        return body
    dims = {"ntid": plan.block, "nctaid": plan.grid}

    def fold(m: re.Match) -> str:
        value = dims[m.group(2)]
        if value is None:
            return m.group(0)
        key = f"llvm.nvvm.read.ptx.sreg.{m.group(2)}.{m.group(3)}"
        found.sreg_calls[key] = found.sreg_calls.get(key, 0) + 1
        return f"{m.group(1)}{value['xyz'.index(m.group(3))]}{m.group(4)}"

    return _SREG_MOV.sub(fold, body)


def _redirect(body: str, names: list[str], what: str) -> str:
    """Every use of the device variables `names` through their pointers (relink.py)."""
    used = [i for i, n in enumerate(names) if re.search(r"(?<![\w$.%])" + re.escape(n) + r"(?![\w$.])", body)]
    if not used:
        return body
    for i in used:
        name = re.escape(names[i])
        reg = f"%pgv{i}"
        body = re.sub(r"\[\s*" + name + r"(?![\w$.])", "[" + reg, body)
        body = re.sub(r"^(\s*(?:@!?%[\w$]+\s+)?mov\.[ub]64\s+%[\w$]+\s*,\s*)" + name + r"(?![\w$.])\s*;",
                      lambda m, reg=reg: m.group(1) + reg + ";", body, flags=re.M)
    # A __constant__ lives in global memory: every const-space access of a function that reaches
    # one through its pointer reads global memory, and no const-space address is made any more.
    body = re.sub(r"\bld\.const\b", "ld.global.nc", body)
    body = re.sub(r"\bldu\.const\b", "ldu.global", body)
    body = re.sub(r"^(\s*(?:@!?%[\w$]+\s+)?)cvta(?:\.to)?\.const\.u64(\s)", r"\1mov.b64\2", body, flags=re.M)
    for i in used:
        if re.search(r"(?<![\w$.%])" + re.escape(names[i]) + r"(?![\w$.])", body):
            line = next(ln for ln in body.splitlines() if re.search(re.escape(names[i]) + r"(?![\w$.])", ln))
            raise SpecializeError(f"{what}: device variable {names[i]} is used in a form that cannot be redirected: "
                                  f"{line.strip()[:120]}")
    count = max(used) + 1
    prelude = [f"\n.reg .b64 %pgv<{count}>;"] + [f"ld.global.u64 %pgv{i}, [{pointer_name(i)}];" for i in used]
    return "\n".join(prelude) + body

