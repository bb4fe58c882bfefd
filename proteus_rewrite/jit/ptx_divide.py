"""Exact strength reduction of division by a constant in PTX text, one function body at a time.

A PTX specializer that folds kernel arguments into `mov` immediates leaves divisions such as
`div.s32 %r5, %r3, %r4` whose divisor register now holds a known value. ptxas -O3 propagates the
constant but does not strength-reduce integer division or remainder by it (it still emits the
generic reciprocal-and-correct sequence, some twenty instructions), nor does it turn a float
division by a power of two into a multiply. This module does both, and only where the result is
bit-for-bit the same:

  div/rem .s32 .u32 .s64 .u64 by a constant C
      C == 1, C == -1        mov / neg (remainder: 0). The PTX ISA gives no result for the
                             overflowing INT_MIN / -1 (it only calls division by zero
                             machine-specific); neg yields the two's complement wraparound,
                             INT_MIN, and the remainder 0, as the multiply-high sequences do for
                             every other divisor. (Not checked against hardware here.)
      |C| == 2^k             shifts, with the signed round-toward-zero fix (Hacker's Delight
                             10-1); unsigned remainder is an `and`
      otherwise              multiply-high by a magic number (Hacker's Delight 10-1 signed; for
                             unsigned, the Granlund-Montgomery round-up method, with the
                             "add indicator" form when the magic needs N+1 bits)
      remainder              a - q*C
      C == 0                 left alone (PTX's value for it is machine-specific)
  div.rn{.ftz}.f32, div.rn.f64 by +-2^k where +-2^-k is exactly representable (and, under .ftz,
      neither is subnormal)  -> mul.rn{.ftz} by +-2^-k: x/2^k and x*2^-k are the same real
      number, so the one rounding gives the same result, subnormals, zeros, infinities and NaN
      included
  rcp.rn{.ftz}.f32, rcp.rn.f64 of such a constant -> mov of +-2^-k

A divisor is constant when it is an immediate in the instruction, or a register whose only
definition in the body is an unguarded `mov` of an immediate. Anything written elsewhere, as the
first operand of any other instruction (vector destinations and `p|q` pairs included), by a
guarded mov, or declared inside a nested `{ }` scope (where a name may shadow another) is not.

Guarded instructions (`@%p div ...`, `@!%p ...`) are rewritten too: every instruction of the
replacement carries the same guard, so the temporaries are only written where the division
would have run. Only lines holding one instruction alone are rewritten, and only when the
dividend is a register; every other byte of the body is kept as it was.

Temporaries are fresh registers declared on a `.reg` line put at the start of the body, named
%pdv<N> (32-bit) and %pdl<N> (64-bit), names nvcc and LLVM never produce; if a body already
uses them (it was rewritten before), a suffixed prefix is chosen.

Limitation: a function whose parameters are `.reg` registers (not what nvcc or LLVM emit; they
pass `.param`) may define a register outside the body; such bodies must not be passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["rewrite_divisions"]

_REG = r"%[A-Za-z_$][\w$]*"
_INT_IMM = r"-?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}|[0-9]+)U?"
_GUARD = r"@!?%[\w$]+"

_IMM_RE = re.compile(rf"^{_INT_IMM}$")
_MOV_CONST_RE = re.compile(rf"^mov\.(?:[bus](16|32|64)|f(32|64))\s+({_REG})\s*,\s*({_INT_IMM})$")
_LINE_RE = re.compile(
    rf"^(?P<indent>[ \t]*)(?P<guard>{_GUARD}[ \t]+)?(?P<op>[a-z][\w.]*)[ \t]+(?P<args>[^;]*?)[ \t]*;"
    rf"(?P<tail>[ \t]*(?://.*)?)$"
)
_REG_IN_TEXT = re.compile(_REG)
_DECL_RANGE_RE = re.compile(r"^(%[A-Za-z_$][\w$]*?)<(\d+)>$")


def _parse_imm(text: str, width: int) -> int | None:
    """The bits an immediate stands for at `width` bits, or None when it is not one."""
    if not _IMM_RE.match(text):
        return None
    neg = text.startswith("-")
    body = text[1:] if neg else text
    if body.endswith("U"):
        body = body[:-1]
    low = body.lower()
    if low.startswith("0f"):
        if width != 32:
            return None
        value = int(low[2:], 16)
    elif low.startswith("0d"):
        if width != 64:
            return None
        value = int(low[2:], 16)
    elif low.startswith("0x"):
        value = int(low[2:], 16)
    elif low.startswith("0b"):
        value = int(low[2:], 2)
    elif len(low) > 1 and low.startswith("0"):
        # PTX reads a leading 0 as octal, as C does
        if any(c not in "01234567" for c in low):
            return None
        value = int(low, 8)
    else:
        value = int(low)
    if neg:
        if low.startswith(("0f", "0d")):
            return None
        value = -value
    return value & ((1 << width) - 1)


def _statements(body: str):
    """(depth, statement text) for each `;`-terminated statement, comments removed; depth counts the
    `{ }` scope blocks around it (braces that open a statement; those inside operands are vectors)."""
    text = re.sub(r"//[^\n]*", "", body)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    depth = 0
    for chunk in text.split(";"):
        s = chunk.strip()
        while s and s[0] in "{}":
            depth += 1 if s[0] == "{" else -1
            s = s[1:].lstrip()
        # labels before the instruction
        while True:
            m = re.match(r"^[A-Za-z_$][\w$]*\s*:(?!:)\s*", s)
            if not m:
                break
            s = s[m.end():]
        if s:
            yield depth, s


def _declared_names(decl: str) -> list[str]:
    """Register names a `.reg` directive declares, `%r<4>` expanded to %r0..%r3."""
    m = re.match(r"^\.reg\s+(?:\.v\d\s+)?\.\w+\s+(.*)$", decl, flags=re.S)
    if not m:
        return []
    names = []
    for part in m.group(1).split(","):
        part = part.strip()
        r = _DECL_RANGE_RE.match(part)
        if r:
            names.extend(f"{r.group(1)}{i}" for i in range(int(r.group(2))))
        elif part:
            names.append(part.split()[0])
    return names


def _constant_registers(body: str) -> dict[str, tuple[int, int]]:
    """Register -> (width, bits) for every register whose only definition is an unguarded mov of an immediate."""
    defs: dict[str, int] = {}
    movs: dict[str, tuple[int, int]] = {}
    scoped: set[str] = set()
    for depth, s in _statements(body):
        if s.startswith("."):
            if depth > 0 and s.startswith(".reg"):
                scoped.update(_declared_names(s))
            continue
        guarded = s.startswith("@")
        if guarded:
            parts = s.split(None, 1)
            s = parts[1] if len(parts) > 1 else ""
        parts = s.split(None, 1)
        if len(parts) < 2:
            continue
        # the first operand is where every PTX instruction writes; for those that only read it
        # (st, red, bra, ...) counting it as a definition only makes fewer registers constant
        first = _first_operand(parts[1])
        for reg in _REG_IN_TEXT.findall(first):
            defs[reg] = defs.get(reg, 0) + 1
        if not guarded:
            m = _MOV_CONST_RE.match(s)
            # a float mov's immediate counts only in its 0f/0d form (the bits, as written)
            if m and (m.group(1) or m.group(4).lower().startswith(("0f", "0d"))):
                width = int(m.group(1) or m.group(2))
                bits = _parse_imm(m.group(4), width)
                if bits is not None:
                    movs[m.group(3)] = (width, bits)
    return {r: v for r, v in movs.items() if defs.get(r) == 1 and r not in scoped}


def _first_operand(args: str) -> str:
    level = 0
    for i, c in enumerate(args):
        if c in "{[(":
            level += 1
        elif c in "}])":
            level -= 1
        elif c == "," and level == 0:
            return args[:i]
    return args


def _split_args(args: str) -> list[str] | None:
    if any(c in args for c in "{}[]()"):
        return None
    return [a.strip() for a in args.split(",")]


def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >> (width - 1) else bits


def _signed_magic(d: int, n: int) -> tuple[int, int]:
    """(M, s) for signed division by d, 2 <= |d| < 2^(n-1) and not a power of two: Hacker's Delight
    figure 10-1, in unbounded integers."""
    two = 1 << (n - 1)
    mask = (1 << n) - 1
    ad = abs(d)
    t = two + (1 if d < 0 else 0)
    anc = t - 1 - t % ad
    p = n - 1
    q1, r1 = divmod(two, anc)
    q2, r2 = divmod(two, ad)
    while True:
        p += 1
        q1, r1 = 2 * q1, 2 * r1
        if r1 >= anc:
            q1, r1 = q1 + 1, r1 - anc
        q2, r2 = 2 * q2, 2 * r2
        if r2 >= ad:
            q2, r2 = q2 + 1, r2 - ad
        delta = ad - r2
        if not (q1 < delta or (q1 == delta and r1 == 0)):
            break
    m = (q2 + 1) & mask
    if d < 0:
        m = (-m) & mask
    return _signed(m, n), p - n


def _unsigned_magic(d: int, n: int) -> tuple[int, int]:
    """(m, s) with floor(x/d) == floor(x*m / 2^(n+s)) for every n-bit x: the smallest s for which
    2^(n+s) <= m*d <= 2^(n+s) + 2^s holds (Granlund and Montgomery, theorem 4.2); m may need n+1 bits."""
    for s in range(d.bit_length() + 1):
        m = -((-1 << (n + s)) // d)
        if m * d - (1 << (n + s)) <= (1 << s):
            return m, s
    raise AssertionError("unreachable: s = ceil(log2 d) always satisfies the bound")


@dataclass
class _Fresh:
    prefix32: str
    prefix64: str
    n32: int = 0
    n64: int = 0

    def take(self, width: int) -> str:
        if width == 32:
            self.n32 += 1
            return f"{self.prefix32}{self.n32 - 1}"
        self.n64 += 1
        return f"{self.prefix64}{self.n64 - 1}"


def _fresh_prefix(body: str, base: str) -> str:
    for suffix in ["", *"abcdefghijklmnopqrstuvwxyz"]:
        if not re.search(re.escape(base + suffix) + r"\d", body):
            return base + suffix
    raise ValueError(f"no free register prefix like {base}")


def _int_sequence(op: str, ty: str, dst: str, a: str, bits: int, fresh: _Fresh) -> list[str] | None:
    """Instructions (without guard or indent) that compute `op.ty dst, a, C` for C's bits, or None to leave it."""
    n = int(ty[1:])
    signed = ty[0] == "s"
    d = _signed(bits, n) if signed else bits
    if d == 0:
        return None
    b, s_, u = f"b{n}", f"s{n}", f"u{n}"
    t = s_ if signed else u
    fmt = str if signed else (lambda v: f"0x{v:X}")
    out: list[str] = []

    def tmp() -> str:
        return fresh.take(n)

    if d == 1 or (signed and d == -1):
        if op == "rem":
            return [f"mov.{b} {dst}, 0"]
        return [f"mov.{b} {dst}, {a}" if d == 1 else f"neg.{s_} {dst}, {a}"]

    ad = abs(d)
    pow2 = ad & (ad - 1) == 0
    if not signed and pow2:
        k = ad.bit_length() - 1
        if op == "rem":
            return [f"and.{b} {dst}, {a}, {fmt(ad - 1)}"]
        return [f"shr.{u} {dst}, {a}, {k}"]

    # the quotient goes straight to dst for div; for rem it is a temporary and dst is written last
    q = dst if op == "div" else tmp()

    if signed and pow2:
        k = ad.bit_length() - 1
        if k > 1:
            t1 = tmp()
            out.append(f"shr.{s_} {t1}, {a}, {k - 1}")
        else:
            t1 = a
        t2, t3 = tmp(), tmp()
        out.append(f"shr.{u} {t2}, {t1}, {n - k}")
        out.append(f"add.{s_} {t3}, {a}, {t2}")
        if d < 0:
            t4 = tmp()
            out.append(f"shr.{s_} {t4}, {t3}, {k}")
            out.append(f"neg.{s_} {q}, {t4}")
        else:
            out.append(f"shr.{s_} {q}, {t3}, {k}")
    elif signed:
        m, sh = _signed_magic(d, n)
        t1 = tmp()
        out.append(f"mul.hi.{s_} {t1}, {a}, {m}")
        if d > 0 and m < 0:
            t2 = tmp()
            out.append(f"add.{s_} {t2}, {t1}, {a}")
            t1 = t2
        elif d < 0 and m > 0:
            t2 = tmp()
            out.append(f"sub.{s_} {t2}, {t1}, {a}")
            t1 = t2
        if sh:
            t2 = tmp()
            out.append(f"shr.{s_} {t2}, {t1}, {sh}")
            t1 = t2
        # round toward zero: add 1 when the floor quotient is negative
        t3 = tmp()
        out.append(f"shr.{u} {t3}, {t1}, {n - 1}")
        out.append(f"add.{s_} {q}, {t1}, {t3}")
    else:
        m, sh = _unsigned_magic(d, n)
        if m < (1 << n):
            if sh:
                t1 = tmp()
                out.append(f"mul.hi.{u} {t1}, {a}, {fmt(m)}")
                out.append(f"shr.{u} {q}, {t1}, {sh}")
            else:
                out.append(f"mul.hi.{u} {q}, {a}, {fmt(m)}")
        else:
            # m = 2^n + m': a*m / 2^(n+s) = (hi(a*m') + a) / 2^s, and the sum can carry out of n bits,
            # so halve it first as t + (a - t)/2 (t <= a); s >= 1 here since d >= 2
            t1, t2, t3 = tmp(), tmp(), tmp()
            out.append(f"mul.hi.{u} {t1}, {a}, {fmt(m - (1 << n))}")
            out.append(f"sub.{u} {t2}, {a}, {t1}")
            out.append(f"shr.{u} {t3}, {t2}, 1")
            if sh > 1:
                t4 = tmp()
                out.append(f"add.{u} {t4}, {t3}, {t1}")
                out.append(f"shr.{u} {q}, {t4}, {sh - 1}")
            else:
                out.append(f"add.{u} {q}, {t3}, {t1}")

    if op == "rem":
        p = tmp()
        out.append(f"mul.lo.{t} {p}, {q}, {fmt(d if signed else bits)}")
        out.append(f"sub.{t} {dst}, {a}, {p}")
    return out


# (exponent bits, mantissa bits) of .f32 and .f64
_FLOAT = {32: (8, 23), 64: (11, 52)}


def _float_reciprocal(bits: int, width: int, ftz: bool) -> str | None:
    """The PTX immediate of 1/C when C (its bits) is +-2^k and 1/C is exactly representable (under ftz,
    neither may be subnormal, since ftz would read it as zero); else None."""
    ebits, mbits = _FLOAT[width]
    bias = (1 << (ebits - 1)) - 1
    sign = bits >> (width - 1)
    exp = (bits >> mbits) & ((1 << ebits) - 1)
    man = bits & ((1 << mbits) - 1)
    if exp == (1 << ebits) - 1:
        return None
    if exp:
        if man:
            return None
        k = exp - bias
        c_subnormal = False
    else:
        if man == 0 or man & (man - 1):
            return None
        k = man.bit_length() - 1 - (bias - 1) - mbits
        c_subnormal = True
    r = -k
    if r >= 1 - bias:
        if r > bias:
            return None
        rbits = (r + bias) << mbits
        r_subnormal = False
    else:
        shift = r + (bias - 1) + mbits
        if shift < 0:
            return None
        rbits = 1 << shift
        r_subnormal = True
    if ftz and (c_subnormal or r_subnormal):
        return None
    rbits |= sign << (width - 1)
    return f"0f{rbits:08X}" if width == 32 else f"0d{rbits:016X}"


_INT_DIV_RE = re.compile(r"^(div|rem)\.([su](?:32|64))$")
_FLOAT_DIV_RE = re.compile(r"^div\.rn(\.ftz)?\.f(32|64)$")
_RCP_RE = re.compile(r"^rcp\.rn(\.ftz)?\.f(32|64)$")


def rewrite_divisions(body: str) -> tuple[str, int]:
    """The function body (the text between a PTX function's braces) with every exact rewrite applied; and how many instructions were rewritten."""  # noqa: E501
    if not re.search(r"\b(?:div|rem|rcp)\.", body):
        return body, 0
    consts = _constant_registers(body)
    fresh = _Fresh(_fresh_prefix(body, "%pdv"), _fresh_prefix(body, "%pdl"))

    def constant(operand: str, width: int, floating: bool = False) -> int | None:
        if operand.startswith("%"):
            c = consts.get(operand)
            return c[1] if c is not None and c[0] == width else None
        if floating and not operand.lower().startswith(("0f", "0d")):
            return None
        return _parse_imm(operand, width)

    lines = body.split("\n")
    out: list[str] = []
    count = 0
    for line in lines:
        m = _LINE_RE.match(line)
        seq = None
        if m:
            op, args = m.group("op"), _split_args(m.group("args"))
            seq = _rewrite_one(op, args, constant, fresh) if args else None
        if seq is None:
            out.append(line)
            continue
        count += 1
        indent, guard = m.group("indent"), m.group("guard") or ""
        new = [f"{indent}{guard}{ins};" for ins in seq]
        new[-1] += m.group("tail")
        out.extend(new)
    if not count:
        return body, 0
    decls = []
    if fresh.n32:
        decls.append(f"\t.reg .b32 {fresh.prefix32}<{fresh.n32}>;")
    if fresh.n64:
        decls.append(f"\t.reg .b64 {fresh.prefix64}<{fresh.n64}>;")
    text = "\n".join(out)
    if decls:
        text = "\n" + "\n".join(decls) + ("" if text.startswith("\n") else "\n") + text
    return text, count


def _rewrite_one(op, args, constant, fresh) -> list[str] | None:
    m = _INT_DIV_RE.match(op)
    if m and len(args) == 3:
        dst, a, c = args
        width = int(m.group(2)[1:])
        bits = constant(c, width)
        if bits is None or not re.fullmatch(_REG, a) or not re.fullmatch(_REG, dst):
            return None
        return _int_sequence(m.group(1), m.group(2), dst, a, bits, fresh)
    m = _FLOAT_DIV_RE.match(op)
    if m and len(args) == 3:
        dst, a, c = args
        ftz, width = bool(m.group(1)), int(m.group(2))
        if ftz and width == 64:
            return None
        bits = constant(c, width, True)
        if bits is None or not re.fullmatch(_REG, a) or not re.fullmatch(_REG, dst):
            return None
        imm = _float_reciprocal(bits, width, ftz)
        if imm is None:
            return None
        return [f"mul.rn{m.group(1) or ''}.f{width} {dst}, {a}, {imm}"]
    m = _RCP_RE.match(op)
    if m and len(args) == 2:
        dst, c = args
        ftz, width = bool(m.group(1)), int(m.group(2))
        if ftz and width == 64:
            return None
        bits = constant(c, width, True)
        if bits is None or not re.fullmatch(_REG, dst):
            return None
        imm = _float_reciprocal(bits, width, ftz)
        if imm is None:
            return None
        return [f"mov.f{width} {dst}, {imm}"]
    return None
