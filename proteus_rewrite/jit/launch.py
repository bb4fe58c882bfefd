"""One kernel launch as the specializer sees it, and how argument bytes become IR constants."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import SpecializeError
from ..fatbin.table import KernelRecord, ParamRecord

Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class Launch:
    args: tuple[bytes, ...]  # one buffer per parameter, exactly as the runtime passes it
    grid: Dim3
    block: Dim3
    arch: int | str  # the device's SM version, e.g. 90 (CUDA), or its AMDGPU processor, e.g. "gfx90a" (HIP)
    globals: dict[str, int] = field(default_factory=dict)  # device variable -> its address in the AOT module
    unknown: frozenset[int] = frozenset()  # parameters whose value is not known (never folded)
    unknown_dims: frozenset[str] = frozenset()  # "block" / "grid": not folded, not bounding the kernel

    def check(self, kernel: KernelRecord) -> None:
        if len(self.args) != len(kernel.params):
            raise SpecializeError(f"{kernel.demangled}: launch has {len(self.args)} arguments, kernel takes {len(kernel.params)}")
        for p, a in zip(kernel.params, self.args):
            if len(a) != p.size:
                raise SpecializeError(f"{kernel.demangled}: argument {p.index} is {len(a)} bytes, parameter is {p.size}")
        for d in (*self.grid, *self.block):
            if d < 1:
                raise SpecializeError(f"{kernel.demangled}: launch dimensions must be positive: grid {self.grid} block {self.block}")


INT_TYPES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8}
FLOAT_TYPES = {"half": ("e", 2), "bfloat": (None, 2), "float": ("f", 4), "double": ("d", 8)}


# The PTX route folds a by-value aggregate up to this size as the bytes each `ld.param` reads;
# a larger one (a struct of many arrays) would put too many bytes in every launch's key.
PTX_AGGREGATE_MAX = 64


def foldable(p: ParamRecord, code: str = "bitcode", ptx_floats: bool = False) -> bool:
    """Scalars we know how to turn into constants (and, for the PTX code kind, small by-value
    aggregates). Pointers are never folded. Nor, on the PTX route, are floating-point values
    unless `ptx_floats` (PROTEUS_PTX_FOLD_FLOATS): ptxas folds a product of two constants,
    rounded, where the AOT code fused the multiply into the add that uses it (one rounding), so
    the result could change in its last bit (docs/dev/findings/ptx-route.md)."""
    if code == "ptx" and p.kind == "aggregate":
        return p.size <= PTX_AGGREGATE_MAX
    if code == "ptx" and p.kind == "float":
        return ptx_floats and p.llvm_type in ("float", "double")
    return (p.kind == "int" and p.llvm_type in INT_TYPES) or (p.kind == "float" and p.llvm_type in FLOAT_TYPES)


def ir_constant(p: ParamRecord, raw: bytes) -> str:
    """The LLVM IR constant (without its type) for the argument bytes of a scalar parameter."""
    t = p.llvm_type
    if t in INT_TYPES:
        value = int.from_bytes(raw[: INT_TYPES[t]], "little", signed=True)
        if t == "i1":
            return "true" if raw[0] & 1 else "false"
        return str(value)
    if t == "double":
        return f"0x{int.from_bytes(raw[:8], 'little'):016X}"
    if t == "float":
        # LLVM writes float constants as the hex of the equal double; every float is exact in a double.
        (value,) = struct.unpack("<f", raw[:4])
        return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}" if value == value else _float_nan(raw)
    if t == "half":
        return f"0xH{int.from_bytes(raw[:2], 'little'):04X}"
    if t == "bfloat":
        return f"0xR{int.from_bytes(raw[:2], 'little'):04X}"
    raise SpecializeError(f"cannot fold a parameter of type {t}")


def _float_nan(raw: bytes) -> str:
    # A NaN's payload must survive: widen the float's bits to the double's layout by hand.
    bits = int.from_bytes(raw[:4], "little")
    sign, mantissa = bits >> 31, bits & 0x7FFFFF
    return f"0x{(sign << 63) | (0x7FF << 52) | (mantissa << 29):016X}"


def python_value(p: ParamRecord, raw: bytes):
    """A readable value for reports: int, float or bool."""
    t = p.llvm_type
    if t == "i1":
        return bool(raw[0] & 1)
    if t in INT_TYPES:
        return int.from_bytes(raw[: INT_TYPES[t]], "little", signed=True)
    if t in ("float", "double", "half"):
        fmt, size = FLOAT_TYPES[t]
        return struct.unpack("<" + fmt, raw[:size])[0]
    return raw.hex()


def parse_value(p: ParamRecord, text: str) -> bytes:
    """Argument bytes from a command-line value (`--arg N=VALUE`)."""
    try:
        if p.kind == "pointer":
            return int(text, 0).to_bytes(p.size, "little")
        t = p.llvm_type
        if t == "i1":
            if text.lower() not in ("0", "1", "true", "false"):
                raise ValueError("expected 0, 1, true or false")
            return bytes([text.lower() in ("1", "true")]).ljust(p.size, b"\0")
        if t in INT_TYPES:
            v = int(text, 0)
            bits = INT_TYPES[t] * 8
            if not -(1 << (bits - 1)) <= v < (1 << bits):
                raise ValueError(f"out of range for {t}")
            return (v & ((1 << bits) - 1)).to_bytes(INT_TYPES[t], "little").ljust(p.size, b"\0")
        if t in ("float", "double", "half"):
            fmt, size = FLOAT_TYPES[t]
            return struct.pack("<" + fmt, float(text)).ljust(p.size, b"\0")
        if p.kind in ("aggregate", "vector", "unknown"):
            raw = bytes.fromhex(text.removeprefix("0x"))
            if len(raw) != p.size:
                raise ValueError(f"expected {p.size} bytes of hex")
            return raw
    except (ValueError, struct.error, OverflowError) as exc:
        raise SpecializeError(f"argument {p.index} ({p.llvm_type}): bad value {text!r}: {exc}") from None
    raise SpecializeError(f"argument {p.index}: cannot parse a value of type {p.llvm_type}")
