"""Floating-point contraction kept as the AOT code had it, once launch values are constants.

nvcc emits `mul.f32` and `add.f32` without a rounding modifier, which lets ptxas contract a
multiply whose one use is an add into a fused multiply-add (one rounding). With both factors
folded into constants, ptxas instead computes the product at compile time, rounded, and adds it
later: two roundings, and a result that may differ in its last bit from the AOT code's, which
saw values it did not know and fused (docs/dev/findings/ptx-route.md). So, before ptxas sees the
text, such a pair is written as the `fma.rn` the AOT code executed.

A register is constant here when its only definition, unguarded, is an instruction of the list
below whose every source is an immediate or a constant register. Pairs are rewritten only where
the product has exactly one use, as ptxas contracts them.
"""

from __future__ import annotations

import re

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
    out, depth, cur = [], 0, ""
    for c in text:
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def _contractible(opcode: str, base: str) -> tuple[str, bool] | None:
    """(type, ftz) of a `mul`/`add`/`sub` that ptxas may contract: f32 or f64, no rounding
    modifier, no saturation."""
    parts = opcode.split(".")
    if parts[0] != base or parts[-1] not in ("f32", "f64"):
        return None
    mods = set(parts[1:-1])
    if mods & _ROUNDING or "sat" in mods or mods - {"ftz"}:
        return None
    return parts[-1], "ftz" in mods


def keep_contraction(body: str) -> tuple[str, int]:
    """The body with each contractible multiply of two constants and the add or subtract that
    is its one use written as one `fma.rn`; and how many were."""
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
        if len(uses.get(product, ())) != 1:
            continue
        use = uses[product][0]
        kind = next(((b, c) for b in ("add", "sub") if (c := _contractible(use.group(3), b)) is not None), None)
        if kind is None or kind[1] != mul or use.start() in edits or use.start() < m.start():
            continue
        uops = _operands(use.group(4))
        if len(uops) != 3 or uops.count(product) != 1:
            continue
        dest, x, y = uops
        typ, ftz = mul
        rounding = "rn.ftz" if ftz else "rn"
        a, b = ops[1], ops[2]
        if kind[0] == "add":
            addend = y if x == product else x
            text = f"fma.{rounding}.{typ} {dest}, {a}, {b}, {addend};"
        else:  # a*b - y = fma(a, b, -y); x - a*b = fma(-a, b, x): negation is exact, in a scope of its own
            neg = f"%pfc{len(edits)}"
            if x == product:
                text = f"{{ .reg .{typ} {neg}; neg.{typ} {neg}, {y}; fma.{rounding}.{typ} {dest}, {a}, {b}, {neg}; }}"
            else:
                text = f"{{ .reg .{typ} {neg}; neg.{typ} {neg}, {a}; fma.{rounding}.{typ} {dest}, {neg}, {b}, {x}; }}"
        edits[use.start()] = use.group(1) + (use.group(2) or "") + text
    count = len(edits)
    if not count:
        return body, 0
    out, last = [], 0
    for m in instrs:
        if m.start() in edits:
            out.append(body[last:m.start()])
            out.append(edits[m.start()])
            last = m.end()
    out.append(body[last:])
    return "".join(out), count
