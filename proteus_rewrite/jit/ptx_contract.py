"""Floating-point results kept as the AOT code computed them, once launch values are constants.

Two things ptxas does with constants that it could not do in the AOT code, each changing a
result in its last bits (docs/dev/findings/ptx-route.md): it rounds a product of two constants
at compile time where the AOT code fused the multiply into its add (keep_contraction), and it
evaluates an approximate instruction (`ex2.approx`, `rcp.approx`, ...) of a constant with its
own arithmetic where the AOT code ran the hardware's (keep_approximations).

nvcc emits `mul.f32` and `add.f32` without a rounding modifier, which lets ptxas contract a
multiply whose one use is an add into a fused multiply-add (one rounding). With both factors
folded into constants, ptxas instead computes the product at compile time, rounded, and adds it
later: two roundings, and a result that may differ in its last bit from the AOT code's, which
saw values it did not know and fused (docs/dev/findings/ptx-route.md). So, before ptxas sees the
text, such a pair is written as the `fma.rn` the AOT code executed.

A register is constant here when its only definition, unguarded, is an instruction of the list
below whose every source is an immediate or a constant register. A product is fused where
ptxas 13.0 fuses one (checked in SASS): into every use when all its uses are adds or subtracts,
into none when anything else uses it.
"""

from __future__ import annotations

import re

from ..fatbin.ptx import split_top_level

_INSTRUCTION = re.compile(r"^([ \t]*)(@!?%[\w$]+[ \t]+)?([a-z][\w.]*)[ \t]+([^;\n]*);", re.M)
_REGISTER = re.compile(r"%[\w$.]+")
_IMMEDIATE = re.compile(r"^(?:-?(?:0[xX][0-9a-fA-F]+|\d+)U?|0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}|-?\d+\.\d*(?:e[-+]?\d+)?)$")
# instructions whose result is a function of their sources alone
_PURE = {"mov", "cvt", "add", "sub", "mul", "mad", "fma", "neg", "abs", "min", "max", "shl", "shr", "and", "or",
         "xor", "not", "div", "rem", "cvta", "rcp", "sqrt", "copysign", "selp", "mul24", "mad24", "cnot", "bfe", "bfi",
         "prmt", "popc", "clz", "brev", "setp", "set", "testp"}
_ROUNDING = {"rn", "rz", "rm", "rp", "rna", "rs"}
_SPECIAL = re.compile(r"^%(?:tid|ntid|ctaid|nctaid|laneid|warpid|nwarpid|smid|nsmid|gridid|clock|clock64|globaltimer|"
                      r"envreg|lanemask|dynamic_smem_size|total_smem_size|pm|cluster)")


def _operands(text: str) -> list[str]:
    return split_top_level(text, "{[", "}]")


def _contractible(opcode: str, base: str) -> tuple[str, bool] | None:
    """(type, ftz) of a `mul`/`add`/`sub` that ptxas may contract: a floating-point type, no
    rounding modifier, no saturation."""
    parts = opcode.split(".")
    if parts[0] != base or parts[-1] not in _FLOAT_BITS:
        return None
    mods = set(parts[1:-1])
    if mods & _ROUNDING or "sat" in mods or mods - {"ftz"}:
        return None
    return parts[-1], "ftz" in mods


def _analysis(body: str):
    """The body's instructions, each register's definitions and uses, and the constant registers."""
    instrs = list(_INSTRUCTION.finditer(body))
    defs: dict[str, list[re.Match]] = {}
    uses: dict[str, list[re.Match]] = {}
    for m in instrs:
        ops = _operands(m.group(4))
        if not ops:
            continue
        opcode = m.group(3).split(".")[0]
        stores = opcode in ("st", "red", "bra", "ret", "bar", "call", "membar", "fence", "exit", "trap", "prefetch")
        dests = [] if stores else _REGISTER.findall(ops[0])
        for r in dests:
            defs.setdefault(r, []).append(m)
        for op in (ops if stores else ops[1:]):
            for r in _REGISTER.findall(op):
                uses.setdefault(r, []).append(m)
    const: set[str] = set()
    changed = True
    while changed:
        changed = False
        for reg, ds in defs.items():
            if reg in const or len(ds) != 1 or ds[0].group(2):
                continue
            m = ds[0]
            if m.group(3).split(".")[0] not in _PURE:
                continue
            sources = _operands(m.group(4))[1:]
            if sources and all(_IMMEDIATE.match(s) or (s in const and not _SPECIAL.match(s)) for s in sources):
                const.add(reg)
                changed = True
    return instrs, defs, uses, const


# The floating-point types contraction applies to, and the bit type of each (the packed half
# types are 32 bits wide); the zero of keep_approximations is made that wide.
_FLOAT_BITS = {"f16": "b16", "bf16": "b16", "f16x2": "b32", "bf16x2": "b32", "f32": "b32", "f64": "b64"}
_WIDEN = {"b16": "cvt.u16.u32 {zero}, {zero}z;", "b32": "mov.b32 {zero}, {zero}z;", "b64": "cvt.u64.u32 {zero}, {zero}z;"}

# Approximate instructions: the hardware's result (MUFU) need not be the value ptxas computes
# for a constant operand (it folds them: rcp.approx.ftz.f32 of 0.75 became 0x3faaaaab).
_APPROX = re.compile(r"^(?:ex2|lg2|sin|cos|rsqrt|tanh)\.|^(?:rcp|sqrt|div)\.(?:[\w.]*\.)?(?:approx|full)\.")


def keep_approximations(body: str) -> tuple[str, int]:
    """The body with each approximate instruction whose sources are all constants given one
    source ptxas cannot evaluate: the constant OR-ed with bit 31 of %dynamic_smem_size, which is
    0 at run time (a launch's dynamic shared memory is far below 2 GiB) and unknown to ptxas, so
    the hardware computes it as it did in the AOT code. And how many were."""
    instrs, _defs, _uses, const = _analysis(body)
    edits: dict[int, str] = {}
    for m in instrs:
        if not _APPROX.match(m.group(3)) or m.group(3).split(".")[-1] not in _FLOAT_BITS:
            continue
        ops = _operands(m.group(4))
        if len(ops) < 2 or not all(_IMMEDIATE.match(s) or s in const for s in ops[1:]):
            continue
        ftype = m.group(3).split(".")[-1]
        bits = _FLOAT_BITS[ftype]
        i = len(edits)
        zero, opaque = f"%pza{i}", f"%pzo{i}"
        prelude = [f".reg .b32 {zero}z; .reg .{bits} {zero}; .reg .{bits} {opaque};",
                   f"mov.u32 {zero}z, %dynamic_smem_size;", f"shr.u32 {zero}z, {zero}z, 31;",
                   _WIDEN[bits].format(zero=zero),
                   f"or.{bits} {opaque}, {ops[1]}, {zero};"]
        rest = ", ".join([ops[0], opaque, *ops[2:]])
        edits[m.start()] = (m.group(1) + "{ " + " ".join(prelude) + " " + (m.group(2) or "")
                            + f"{m.group(3)} {rest}; }}")
    return _apply(body, instrs, edits)


def _apply(body: str, instrs, edits: dict[int, str]) -> tuple[str, int]:
    if not edits:
        return body, 0
    out, last = [], 0
    for m in instrs:
        if m.start() in edits:
            out.append(body[last:m.start()])
            out.append(edits[m.start()])
            last = m.end()
    out.append(body[last:])
    return "".join(out), len(edits)


def keep_contraction(body: str) -> tuple[str, int]:
    """The body with each contractible multiply of two constants written as an `fma.rn` in each
    add or subtract that uses it, where those are all its uses; and how many were."""
    instrs, _defs, uses, const = _analysis(body)

    def is_const(s: str) -> bool:
        return bool(_IMMEDIATE.match(s)) or s in const

    edits: dict[int, str] = {}
    for m in instrs:
        mul = _contractible(m.group(3), "mul")
        if mul is None or m.group(2):
            continue
        ops = _operands(m.group(4))
        if len(ops) != 3 or not (is_const(ops[1]) and is_const(ops[2])):
            continue
        product = ops[0]
        # ptxas fuses a product into each of its uses when every use is an add or a subtract
        # (the multiply repeated), and into none when any other instruction uses it
        users = uses.get(product, [])
        rewrites = []
        for use in users:
            kind = next(((b, c) for b in ("add", "sub") if (c := _contractible(use.group(3), b)) is not None), None)
            uops = _operands(use.group(4))
            if (kind is None or kind[1] != mul or use.start() in edits or use.start() < m.start()
                    or len(uops) != 3 or uops.count(product) != 1):
                rewrites = []
                break
            rewrites.append((use, kind[0], uops))
        for use, how, (dest, x, y) in rewrites:
            typ, ftz = mul
            rounding = "rn.ftz" if ftz else "rn"
            a, b = ops[1], ops[2]
            if how == "add":
                addend = y if x == product else x
                text = f"fma.{rounding}.{typ} {dest}, {a}, {b}, {addend};"
            else:  # a*b - y = fma(a, b, -y); x - a*b = fma(-a, b, x): negation is exact, in a scope of its own
                neg = f"%pfc{len(edits)}"
                if x == product:
                    text = f"{{ .reg .{_FLOAT_BITS[typ]} {neg}; neg.{typ} {neg}, {y}; fma.{rounding}.{typ} {dest}, {a}, {b}, {neg}; }}"
                else:
                    text = f"{{ .reg .{_FLOAT_BITS[typ]} {neg}; neg.{typ} {neg}, {a}; fma.{rounding}.{typ} {dest}, {neg}, {b}, {x}; }}"
            edits[use.start()] = use.group(1) + (use.group(2) or "") + text
    return _apply(body, instrs, edits)
