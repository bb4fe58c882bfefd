"""ptx_divide: the rewritten sequences are bit-exact (run by a small emulator of the PTX they use,
against PTX's truncating division), ptxas accepts them in real nvcc output, and everything that is
not provably exact is left alone."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from proteus_rewrite.jit.ptx_divide import rewrite_divisions

U64 = np.uint64
RNG = np.random.default_rng(20240)
NVCC = Path("/usr/local/cuda/bin/nvcc")
PTXAS = Path("/usr/local/cuda/bin/ptxas")


# --- emulator: registers hold numpy uint64 arrays of the register's bits -------------------------


def _mask(n: int) -> U64:
    return U64((1 << n) - 1)


def _to_signed(x: np.ndarray, n: int) -> np.ndarray:
    """Bits -> int64 values (n = 32 or 64)."""
    if n == 64:
        return x.view(np.int64)
    return (x.astype(np.int64) ^ (1 << 31)) - (1 << 31)


def _from_signed(x: np.ndarray, n: int) -> np.ndarray:
    return x.astype(np.int64).view(U64) & _mask(n)


def _mulhi_u64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lo32 = U64(0xFFFFFFFF)
    a0, a1 = a & lo32, a >> U64(32)
    b0, b1 = b & lo32, b >> U64(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> U64(32)) + (p01 & lo32) + (p10 & lo32)
    return p11 + (p01 >> U64(32)) + (p10 >> U64(32)) + (mid >> U64(32))


def _mulhi(a: np.ndarray, b: np.ndarray, n: int, signed: bool) -> np.ndarray:
    if n == 32:
        if signed:
            return _from_signed((_to_signed(a, 32) * _to_signed(b, 32)) >> 32, 32)
        return (a * b) >> U64(32)
    hi = _mulhi_u64(a, b)
    if signed:
        # signed high half = unsigned high half - (a < 0 ? b : 0) - (b < 0 ? a : 0), mod 2^64
        hi = hi - np.where(a >> U64(63) == 1, b, U64(0)) - np.where(b >> U64(63) == 1, a, U64(0))
    return hi


def _shr(a: np.ndarray, k: int, n: int, signed: bool) -> np.ndarray:
    k = min(k, n)  # PTX clamps shift amounts to the register width
    if signed:
        return _from_signed(_to_signed(a, n) >> min(k, n - 1), n)
    return (a >> U64(k)) if k < n else np.zeros_like(a)


def emulate(body: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the straight-line instructions of a body: the subset the rewrites emit, plus mov."""
    regs = dict(inputs)
    size = len(next(iter(inputs.values())))

    def val(op: str, n: int) -> np.ndarray:
        if op.startswith("%"):
            return regs[op]
        if op.lower().startswith(("0f", "0d")):
            return np.full(size, int(op[2:], 16), dtype=U64)
        return np.full(size, int(op, 0) & ((1 << n) - 1), dtype=U64)

    for raw in body.split("\n"):
        line = raw.split("//")[0].strip()
        if not line or line.startswith("."):
            continue
        assert not line.startswith("@"), "the emulator runs unguarded code only"
        m = re.fullmatch(r"([a-z.0-9]+)\s+(.*);", line)
        assert m, line
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        parts = op.split(".")
        ty = parts[-1]
        n = int(ty[1:])
        signed = ty[0] == "s"
        dst, srcs = args[0], args[1:]
        if parts[0] == "shr":
            x = _shr(val(srcs[0], n), int(srcs[1]), n, signed)
        else:
            xs = [val(s, n) for s in srcs]
            kind = ".".join(parts[:-1])
            if kind == "mov":
                x = xs[0]
            elif kind == "neg":
                x = (U64(0) - xs[0]) & _mask(n)
            elif kind == "add":
                x = (xs[0] + xs[1]) & _mask(n)
            elif kind == "sub":
                x = (xs[0] - xs[1]) & _mask(n)
            elif kind == "and":
                x = xs[0] & xs[1]
            elif kind == "mul.lo":
                x = (xs[0] * xs[1]) & _mask(n)
            elif kind == "mul.hi":
                x = _mulhi(xs[0], xs[1], n, signed)
            else:
                raise AssertionError(f"emulator lacks {op}")
        regs[dst] = x & _mask(n)
    return regs


# --- reference: PTX div/rem truncate toward zero; INT_MIN / -1 wraps to INT_MIN --------------------


def reference(op: str, ty: str, a: np.ndarray, d: int) -> np.ndarray:
    n = int(ty[1:])
    db = U64(d & ((1 << n) - 1))
    if ty[0] == "u":
        return a // db if op == "div" else a % db
    neg_a = (a >> U64(n - 1)) == 1
    abs_a = np.where(neg_a, (U64(0) - a) & _mask(n), a)
    abs_d = U64(abs(d))
    q, r = abs_a // abs_d, abs_a % abs_d
    if op == "div":
        return np.where(neg_a != (d < 0), (U64(0) - q) & _mask(n), q)
    return np.where(neg_a, (U64(0) - r) & _mask(n), r)


def sweep(n: int, count: int = 20_000) -> np.ndarray:
    top = 1 << n
    edges = [0, 1, 2, 3, top - 1, top - 2, top >> 1, (top >> 1) - 1, (top >> 1) + 1, 7, 10, 641, 6700417]
    edges += [(e * s) % top for e in (7, 10, 641, 6700417, 1 << 16, (1 << 16) + 1) for s in (1, -1)]
    near = [(b + o) % top for b in (1 << (n // 2), 1 << (n - 2), 3 << (n - 3)) for o in (-2, -1, 0, 1, 2)]
    vals = np.array(sorted(set(edges + near)), dtype=U64)
    rand = RNG.integers(0, np.iinfo(np.uint64).max, size=count, dtype=U64, endpoint=True) & _mask(n)
    small = RNG.integers(0, 4096, size=count // 4, dtype=U64)
    return np.concatenate([vals, rand, small, (U64(0) - small) & _mask(n)])


SIGNED32 = [1, -1, 2, -2, 3, -3, 5, -5, 6, 7, -7, 10, -10, 11, 25, 60, 64, -64, 100, 125, 641, -641, 1000, 1 << 16, 65537,
            2147483647, -2147483647, 1 << 30, -(1 << 30), 1_000_000_007, -(1 << 31), 0x55555555, 12345678]
UNSIGNED32 = [1, 2, 3, 5, 6, 7, 10, 11, 14, 25, 60, 64, 100, 125, 641, 1000, 65537, 6700417, (1 << 31) - 1, 1 << 31,
              (1 << 31) + 1, 0xFFFFFFFF, 0xFFFFFFFE, 0xAAAAAAAB, 1_000_000_007, 4_294_967_291, 3 << 30, 1 << 20, 12345678,
              0x80000003, 9, 19, 37]
SIGNED64 = [1, -1, 2, -2, 3, -3, 7, -7, 10, 64, -64, 641, 6700417, 274177, 67280421310721, 1 << 32, (1 << 32) + 1,
            (1 << 62), -(1 << 62), (1 << 63) - 1, -(1 << 63) + 1, -(1 << 63), 1_000_000_007, 1_000_000_000_000_000_003,
            -1_000_000_000_000_000_003, 0x5555555555555555, 6, 25, 125, -10, 12345678901, 2305843009213693951, 11]
UNSIGNED64 = [1, 2, 3, 5, 7, 10, 64, 641, 6700417, 274177, 67280421310721, 1 << 32, (1 << 32) + 1, 1 << 63, (1 << 63) + 1,
              (1 << 63) - 1, (1 << 64) - 1, (1 << 64) - 2, 0xAAAAAAAAAAAAAAAB, 18446744073709551557, 1_000_000_007,
              1_000_000_000_000_000_003, 6, 14, 25, 125, 12345678901, 2305843009213693951, 3 << 62, 11, 19, 37, 1 << 40]


@pytest.mark.parametrize(
    "ty,divisors",
    [("s32", SIGNED32), ("u32", UNSIGNED32), ("s64", SIGNED64), ("u64", UNSIGNED64)],
)
@pytest.mark.parametrize("op", ["div", "rem"])
def test_integer_bit_exact(op, ty, divisors):
    n = int(ty[1:])
    assert len(divisors) >= 33
    a = sweep(n)
    assert len(a) >= 20_000
    reg = "%r" if n == 32 else "%rd"
    for i, d in enumerate(divisors):
        # alternate the divisor's forms: a register set once by mov, and an immediate operand
        if i % 2:
            body = f"\n\t.reg .b{n} {reg}<4>;\n\tmov.b{n} {reg}2, {d};\n\t{op}.{ty} {reg}3, {reg}1, {reg}2;\n"
        else:
            body = f"\n\t.reg .b{n} {reg}<4>;\n\t{op}.{ty} {reg}3, {reg}1, {d};\n"
        new, count = rewrite_divisions(body)
        assert count == 1, (op, ty, d)
        assert f"{op}.{ty}" not in new
        got = emulate(new, {f"{reg}1": a})[f"{reg}3"]
        want = reference(op, ty, a, d)
        bad = np.nonzero(got != want)[0]
        assert not len(bad), f"{op}.{ty} by {d}: {a[bad[0]]} gives {got[bad[0]]}, want {want[bad[0]]}"


@pytest.mark.parametrize("op", ["div", "rem"])
def test_destination_is_dividend(op):
    a = sweep(32)
    new, count = rewrite_divisions(f"\n\tmov.u32 %r2, -7;\n\t{op}.s32 %r1, %r1, %r2;\n")
    assert count == 1
    assert np.array_equal(emulate(new, {"%r1": a})["%r1"], reference(op, "s32", a, -7))


def test_power_of_two_and_unit_divisors_are_cheap():
    assert rewrite_divisions("\tdiv.u32 %r3, %r1, 64;")[0].strip() == "shr.u32 %r3, %r1, 6;"
    assert rewrite_divisions("\trem.u64 %rd3, %rd1, 64;")[0].strip() == "and.b64 %rd3, %rd1, 0x3F;"
    assert rewrite_divisions("\tdiv.s32 %r3, %r1, 1;")[0].strip() == "mov.b32 %r3, %r1;"
    assert rewrite_divisions("\tdiv.s32 %r3, %r1, -1;")[0].strip() == "neg.s32 %r3, %r1;"
    assert rewrite_divisions("\trem.s64 %rd3, %rd1, -1;")[0].strip() == "mov.b64 %rd3, 0;"


# --- floats ---------------------------------------------------------------------------------------


def float_sweep(width: int) -> np.ndarray:
    ftype, itype = (np.float32, np.uint32) if width == 32 else (np.float64, np.uint64)
    info = np.finfo(ftype)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, info.max, -info.max, info.tiny, -info.tiny,
               info.smallest_subnormal, -info.smallest_subnormal, 3 * info.smallest_subnormal, info.tiny * 1.5]
    bits = RNG.integers(0, np.iinfo(itype).max, size=20_000, dtype=itype, endpoint=True)
    sub = RNG.integers(0, 1 << (23 if width == 32 else 52), size=2_000, dtype=itype)
    return np.concatenate([np.array(special, dtype=ftype), bits.view(ftype), sub.view(ftype), (-sub.view(ftype))])


def _imm_value(imm: str, width: int) -> float:
    bits = np.array([int(imm[2:], 16)], dtype=np.uint32 if width == 32 else np.uint64)
    return bits.view(np.float32 if width == 32 else np.float64)[0]


def _flush(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.copysign(np.zeros_like(x), x), x)


@pytest.mark.parametrize("width,ftz", [(32, False), (32, True), (64, False)])  # PTX has no div.rn.ftz.f64
def test_float_division_by_power_of_two_is_bit_exact(width, ftz):
    ftype = np.float32 if width == 32 else np.float64
    x = float_sweep(width)
    emax = 127 if width == 32 else 1023
    emin = -149 if width == 32 else -1074
    mod = ".ftz" if ftz else ""
    done = refused = 0
    for k in range(emin, emax + 1):
        for sign in (1, -1):
            c = ftype(sign * np.ldexp(1.0, k)) if width == 64 else np.ldexp(ftype(sign), k)
            cbits = np.array([c], dtype=ftype).view(np.uint32 if width == 32 else np.uint64)[0]
            imm = f"0f{int(cbits):08X}" if width == 32 else f"0d{int(cbits):016X}"
            reg = "%f" if width == 32 else "%fd"
            body = f"\n\tmov.f{width} {reg}2, {imm};\n\tdiv.rn{mod}.f{width} {reg}3, {reg}1, {reg}2;\n"
            new, count = rewrite_divisions(body)
            representable = emin <= -k <= emax
            subnormal = width == 32 and (k < -126 or -k < -126)
            if not representable or (ftz and subnormal):
                assert count == 0 and new == body
                refused += 1
                continue
            assert count == 1
            m = re.search(rf"mul\.rn{re.escape(mod)}\.f{width} {re.escape(reg)}3, {re.escape(reg)}1, (0[fd][0-9A-F]+);", new)
            assert m, new
            cr = _imm_value(m.group(1), width)
            with np.errstate(all="ignore"):
                if ftz:
                    want, got = _flush(_flush(x) / c), _flush(_flush(x) * cr)
                else:
                    want, got = x / c, x * cr
            same = (want.view(cbits.dtype) == got.view(cbits.dtype)) | (np.isnan(want) & np.isnan(got))
            assert same.all(), (k, sign, x[~same][:3])
            done += 1
    assert done > 400 and refused > 0


def test_float_refusals():
    # not a power of two, not .rn, f64 under .ftz does not exist, a decimal immediate is not float bits
    for ins in ["div.rn.f32 %f3, %f1, 0f40400000;", "div.full.f32 %f3, %f1, 0f40000000;",
                "div.approx.f32 %f3, %f1, 0f40000000;", "div.rz.f32 %f3, %f1, 0f40000000;",
                "div.approx.ftz.f32 %f3, %f1, 0f40000000;", "div.rn.f32 %f3, %f1, 2;",
                "div.rn.f32 %f3, %f1, 0f7F800000;", "div.rn.f32 %f3, %f1, 0f00000000;", "rcp.approx.f32 %f3, 0f40000000;",
                "div.rn.f64 %fd3, %fd1, 0d4008000000000000;", "div.rn.f32 %f3, 0f40000000, 0f40000000;"]:
        body = f"\n\t{ins}\n"
        assert rewrite_divisions(body) == (body, 0), ins


def test_rcp_of_power_of_two():
    new, count = rewrite_divisions("\n\tmov.f32 %f1, 0fC0800000;\n\trcp.rn.f32 %f2, %f1;\n\trcp.rn.f64 %fd2, 0d3FE0000000000000;\n")
    assert count == 2
    assert "mov.f32 %f2, 0fBE800000;" in new and "mov.f64 %fd2, 0d4000000000000000;" in new
    # 2^127's reciprocal is subnormal: fine without .ftz, refused with it
    assert rewrite_divisions("\trcp.rn.f32 %f2, 0f7F000000;")[1] == 1
    assert rewrite_divisions("\trcp.rn.ftz.f32 %f2, 0f7F000000;")[1] == 0


# --- what is not constant, and what is left alone -------------------------------------------------


@pytest.mark.parametrize(
    "defs",
    [
        "mov.u32 %r2, 7;\n\tmov.u32 %r2, 9;",  # two movs
        "mov.u32 %r2, 7;\n\tadd.s32 %r2, %r2, 1;",  # written by another instruction
        "mov.u32 %r2, 7;\n\tmov.b64 {%r2, %r5}, %rd1;",  # a vector destination
        "mov.u32 %r2, 7;\n\tld.global.v2.u32 {%r6, %r2}, [%rd1];",
        "mov.u32 %r2, 7;\n\tsetp.lt.s32 %p1|%r2, %r1, 0;",
        "@%p1 mov.u32 %r2, 7;",  # guarded
        "@!%p1 mov.u32 %r2, 7;",
        "mov.u32 %r2, %r1;",  # not an immediate
        "ld.param.u32 %r2, [k_param_0];",
        "mov.u32 %r2, 7;\n\t{\n\t.reg .b32 %r2;\n\tmov.u32 %r2, 3;\n\t}",  # shadowed in a nested scope
        "mov.u32 %r2, 7;\n\t// begin inline asm\n\t{ .reg .b32 %r<4>; mov.b32 %r2, 5; }",
    ],
)
def test_not_constant(defs):
    body = f"\n\t.reg .b32 %r<8>;\n\t{defs}\n\tdiv.s32 %r3, %r1, %r2;\n"
    assert rewrite_divisions(body) == (body, 0)


def test_divisor_zero_and_width_mismatch_untouched():
    for body in ["\n\tmov.u32 %r2, 0;\n\tdiv.s32 %r3, %r1, %r2;\n\trem.u32 %r4, %r1, %r2;\n",
                 "\n\tdiv.u64 %rd3, %rd1, 0;\n", "\n\tmov.u16 %rs2, 7;\n\tdiv.s32 %r3, %r1, %rs2;\n"]:
        assert rewrite_divisions(body) == (body, 0)


def test_guarded_division_keeps_its_guard_on_every_instruction():
    body = "\n\tmov.u32 %r2, 7;\n\t@!%p1 rem.s32 %r3, %r1, %r2; // keep\n\tadd.s32 %r4, %r3, 1;\n"
    new, count = rewrite_divisions(body)
    assert count == 1
    lines = new.split("\n")
    start = lines.index("\tmov.u32 %r2, 7;") + 1
    end = lines.index("\tadd.s32 %r4, %r3, 1;")
    rewritten = lines[start:end]
    assert len(rewritten) > 2 and all(l.startswith("\t@!%p1 ") for l in rewritten)
    assert rewritten[-1].endswith("; // keep") and rewritten[-1].startswith("\t@!%p1 sub.s32 %r3, %r1, ")
    # with the guards removed, the sequence computes the remainder
    a = sweep(32)
    plain = "\n".join(l.replace("@!%p1 ", "") for l in rewritten)
    assert np.array_equal(emulate(plain, {"%r1": a})["%r3"], reference("rem", "s32", a, 7))


def test_everything_else_byte_identical_and_fresh_names():
    body = ("\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<9>;\n\n\tmov.u32 %r2, 10;   // ten\n$L__BB0_1:\n"
            "\tdiv.u32 %r3, %r1, %r2;\n\tst.global.u32 [%rd1], %r3;\n\tret;\n")
    new, count = rewrite_divisions(body)
    assert count == 1
    assert new.startswith("\n\t.reg .b32 %pdv<") and ".reg .b64" not in new
    kept = [l for l in body.split("\n") if "div.u32" not in l]
    new_lines = new.split("\n")
    assert all(l in new_lines for l in kept)
    # a body that already has %pdv registers (rewritten before) gets other names
    body2 = new.replace("div", "x") + "\tmov.u32 %r5, 3;\n\tdiv.u32 %r6, %r1, %r5;\n"
    new2, count2 = rewrite_divisions(body2)
    assert count2 == 1 and ".reg .b32 %pdva<" in new2
    assert rewrite_divisions("\tadd.s32 %r1, %r2, %r3;\n") == ("\tadd.s32 %r1, %r2, %r3;\n", 0)


# --- ptxas on real nvcc output ------------------------------------------------------------------

CU = r"""
extern "C" __global__ void kdiv(int *out, const int *in, int n) {
    int i = threadIdx.x;
    out[i] = in[i] / n;
    out[i + 256] = in[i] % n;
}
extern "C" __global__ void kudiv(unsigned *out, const unsigned *in, unsigned n) {
    int i = threadIdx.x;
    out[i] = in[i] / n + in[i] % n;
}
extern "C" __global__ void kldiv(long long *out, const long long *in, long long n) {
    int i = threadIdx.x;
    out[i] = in[i] / n;
    out[i + 256] = in[i] % n;
}
extern "C" __global__ void kfdiv(float *out, const float *in, float d, double *o2, const double *i2, double dd) {
    int i = threadIdx.x;
    out[i] = in[i] / d;
    o2[i] = i2[i] / dd;
}
"""


def _entry_body(ptx: str, name: str) -> tuple[int, int]:
    """Offsets of the text between the braces of `.entry name`."""
    start = ptx.index(f".entry {name}(")
    open_ = ptx.index("{", ptx.index(")", start))
    depth, i = 0, open_
    while True:
        depth += {"{": 1, "}": -1}.get(ptx[i], 0)
        if depth == 0:
            return open_ + 1, i
        i += 1


def _fold_param(body: str, name: str, index: int, mov: str, value: str) -> tuple[str, str]:
    """Replace the ld.param of parameter `index` by a mov of `value`; the register it loads into."""
    m = re.search(rf"ld\.param\.\w+\s+(%\w+),\s*\[{name}_param_{index}\];", body)
    assert m, body
    return body[: m.start()] + f"{mov} {m.group(1)}, {value};" + body[m.end():], m.group(1)


@pytest.mark.parametrize(
    "kernel,index,mov,value,gone",
    [
        ("kdiv", 2, "mov.u32", "7", ["div.s32", "rem.s32"]),
        ("kdiv", 2, "mov.u32", "-64", ["div.s32", "rem.s32"]),
        ("kdiv", 2, "mov.u32", "-2147483648", ["div.s32", "rem.s32"]),
        ("kudiv", 2, "mov.u32", "641", ["div.u32", "rem.u32"]),
        ("kudiv", 2, "mov.u32", "4294967295", ["div.u32", "rem.u32"]),
        ("kldiv", 2, "mov.u64", "-1000000000000000003", ["div.s64", "rem.s64"]),
        ("kldiv", 2, "mov.u64", "10", ["div.s64", "rem.s64"]),
        ("kfdiv", 2, "mov.f32", "0f3E800000", ["div.rn.f32"]),
        ("kfdiv", 5, "mov.f64", "0dC000000000000000", ["div.rn.f64"]),
    ],
)
def test_ptxas_accepts_rewritten_nvcc_output(tmp_path, kernel, index, mov, value, gone):
    if not NVCC.exists() or not PTXAS.exists() or shutil.which("gcc") is None and shutil.which("g++") is None:
        pytest.skip("needs the CUDA toolkit's nvcc and ptxas")
    cu = tmp_path / "k.cu"
    cu.write_text(CU)
    ptx_path = tmp_path / "k.ptx"
    subprocess.run([str(NVCC), "-arch=sm_90", "-ptx", "-o", str(ptx_path), str(cu)], check=True, capture_output=True)
    ptx = ptx_path.read_text()
    lo, hi = _entry_body(ptx, kernel)
    body, reg = _fold_param(ptx[lo:hi], kernel, index, mov, value)
    assert any(re.search(rf"{re.escape(op)}\s+%\w+,\s*%\w+,\s*{re.escape(reg)};", body) for op in gone), body
    new, count = rewrite_divisions(body)
    assert count > 0
    for op in gone:
        assert not re.search(rf"{re.escape(op)}\s+%\w+,\s*%\w+,\s*{re.escape(reg)};", new), new
    out = tmp_path / "k.ptx.new"
    out.write_text(ptx[:lo] + new + ptx[hi:])
    done = subprocess.run([str(PTXAS), "-arch=sm_90", "-O3", "-o", str(tmp_path / "k.cubin"), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + new


def test_ptxas_accepts_every_form(tmp_path):
    """All four integer types by every kind of divisor (and a guard), as immediates and registers."""
    if not PTXAS.exists():
        pytest.skip("needs the CUDA toolkit's ptxas")
    lines = []
    for ty, divisors in [("s32", SIGNED32), ("u32", UNSIGNED32), ("s64", SIGNED64), ("u64", UNSIGNED64)]:
        reg = "%r" if ty.endswith("32") else "%rd"
        for d in divisors:
            for op in ("div", "rem"):
                lines.append(f"\t@%p1 {op}.{ty} {reg}3, {reg}3, {d};")
                lines.append(f"\t{op}.{ty} {reg}3, {reg}3, {d};")
    lines += ["\tdiv.rn.ftz.f32 %f1, %f1, 0f3F000000;", "\tdiv.rn.f64 %fd1, %fd1, 0d0010000000000000;",
              "\trcp.rn.f32 %f2, 0f40000000;", "\tadd.f32 %f1, %f1, %f2;"]
    body = ("\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<4>;\n\t.reg .f32 %f<3>;\n\t.reg .f64 %fd<2>;\n"
            "\tld.param.u64 %rd1, [k_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tld.global.u32 %r3, [%rd2];\n"
            "\tld.global.u64 %rd3, [%rd2+8];\n\tld.global.f32 %f1, [%rd2+16];\n\tld.global.f64 %fd1, [%rd2+24];\n"
            "\tsetp.eq.s32 %p1, %r3, 5;\n" + "\n".join(lines) +
            "\n\tst.global.u32 [%rd2], %r3;\n\tst.global.u64 [%rd2+8], %rd3;\n\tst.global.f32 [%rd2+16], %f1;\n"
            "\tst.global.f64 [%rd2+24], %fd1;\n\tret;\n")
    new, count = rewrite_divisions(body)
    assert count == len(lines) - 1
    ptx = f".version 9.0\n.target sm_90\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{{new}}}\n"
    src = tmp_path / "all.ptx"
    src.write_text(ptx)
    done = subprocess.run([str(PTXAS), "-arch=sm_90", "-O3", "-o", str(tmp_path / "all.cubin"), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
