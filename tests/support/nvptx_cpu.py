"""Run an NVPTX kernel's LLVM IR on the CPU, one thread after another: a reference executor for
tests that must tell whether an optimization pipeline changed a kernel's results without a GPU.

The module is retargeted to the host (x86-64) and JIT-compiled by llvmlite's MCJIT:
  - the `ptx_kernel` calling convention and the NVPTX target attributes are dropped;
  - `llvm.nvvm.read.ptx.sreg.*` become loads of globals this executor sets before each thread;
  - the NVVM maths intrinsics libdevice uses become the host's generic intrinsics (with the
    flush-to-zero of `.ftz` forms, directed rounding done as round-to-nearest, approximations
    done exactly): the same definitions serve every version of a kernel, so two versions of one
    kernel compare like for like, though neither matches the GPU to the last bit.
Kernels that synchronize (barriers, shuffles, votes), use shared memory or atomics across threads
are refused: threads run one at a time here. Address spaces 1 and 4 are the host's memory.
"""

from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass

import llvmlite.binding as llvm

HOST_LAYOUT = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
HOST_TRIPLE = "x86_64-unknown-linux-gnu"
SREGS = ("tid", "ntid", "ctaid", "nctaid")
REFUSED = ("llvm.nvvm.barrier", "llvm.nvvm.bar.", "llvm.nvvm.shfl", "llvm.nvvm.vote", "llvm.nvvm.match",
           "addrspace(3)", "atomicrmw", "cmpxchg", "llvm.nvvm.atomic")

_F32 = "float"
_F64 = "double"


def _ftz32(x: str) -> list[str]:
    """IR lines flushing float %<x> to %<x>_z: denormals become signed zero."""
    return [f"  %{x}_a = call float @llvm.fabs.f32(float %{x})",
            f"  %{x}_d = fcmp olt float %{x}_a, 0x3810000000000000",
            f"  %{x}_s = call float @llvm.copysign.f32(float 0.0, float %{x})",
            f"  %{x}_z = select i1 %{x}_d, float %{x}_s, float %{x}"]


def _define(name: str, ret: str, params: list[str], body: list[str]) -> str:
    args = ", ".join(f"{t} %p{i}" for i, t in enumerate(params))
    return "\n".join([f"define internal {ret} @{name}({args}) alwaysinline {{"] + body + ["}"])


def _unary(name: str, ty: str, expr: str, ftz: bool) -> str:
    """`expr` uses %x (the input, flushed when ftz) and defines %r."""
    body = [f"  %x0 = bitcast {ty} %p0 to {ty}"]
    if ftz and ty == _F32:
        body += _ftz32("x0") + ["  %x = bitcast float %x0_z to float"]
    else:
        body += [f"  %x = bitcast {ty} %x0 to {ty}"]
    body += expr.splitlines()
    if ftz and ty == _F32:
        body += _ftz32("r") + ["  ret float %r_z"]
    else:
        body += [f"  ret {ty} %r"]
    return _define(name, ty, [ty], body)


def _binary(name: str, ty: str, op: str, ftz: bool) -> str:
    body = []
    a, b = "%p0", "%p1"
    if ftz and ty == _F32:
        body += ["  %a = bitcast float %p0 to float", "  %b = bitcast float %p1 to float"] + _ftz32("a") + _ftz32("b")
        a, b = "%a_z", "%b_z"
    body.append(f"  %r = {op.format(ty=ty, a=a, b=b)}")
    if ftz and ty == _F32:
        body += _ftz32("r") + ["  ret float %r_z"]
    else:
        body.append(f"  ret {ty} %r")
    return _define(name, ty, [ty, ty], body)


def _ternary_fma(name: str, ty: str, ftz: bool) -> str:
    suffix = "f32" if ty == _F32 else "f64"
    body = []
    names = ["%p0", "%p1", "%p2"]
    if ftz and ty == _F32:
        for i, v in enumerate("abc"):
            body += [f"  %{v} = bitcast float %p{i} to float"] + _ftz32(v)
        names = ["%a_z", "%b_z", "%c_z"]
    body.append(f"  %r = call {ty} @llvm.fma.{suffix}({ty} {names[0]}, {ty} {names[1]}, {ty} {names[2]})")
    if ftz and ty == _F32:
        body += _ftz32("r") + ["  ret float %r_z"]
    else:
        body.append(f"  ret {ty} %r")
    return _define(name, ty, [ty, ty, ty], body)


def _generic(op: str, ty: str) -> str:
    suffix = "f32" if ty == _F32 else "f64"
    return f"%r = call {ty} @llvm.{op}.{suffix}({ty} %x)"


def _math_definition(intrinsic: str) -> str | None:
    """A host definition for one NVVM maths intrinsic (its name without `llvm.nvvm.`), or None."""
    m = re.fullmatch(r"(?P<op>[a-z0-9]+)(?:\.(?P<mode>approx|rn|rm|rp|rz|full))?(?P<ftz>\.ftz)?"
                     r"(?:\.(?P<ty>f|d|f32|f64))?", intrinsic)
    if not m:
        return None
    op, ftz = m["op"], bool(m["ftz"])
    ty = _F64 if m["ty"] in ("d", "f64") else _F32
    name = "__cpu_nvvm_" + intrinsic.replace(".", "_")
    unary = {"ex2": _generic("exp2", ty), "lg2": _generic("log2", ty), "sqrt": _generic("sqrt", ty),
             "sin": _generic("sin", ty), "cos": _generic("cos", ty), "fabs": _generic("fabs", ty),
             "round": _generic("round", ty), "trunc": _generic("trunc", ty), "floor": _generic("floor", ty),
             "ceil": _generic("ceil", ty),
             "rsqrt": f"%s = call {ty} @llvm.sqrt.{'f32' if ty == _F32 else 'f64'}({ty} %x)\n  %r = fdiv {ty} 1.0, %s",
             "rcp": f"%r = fdiv {ty} 1.0, %x",
             "saturate": (f"%lo = call {ty} @llvm.maxnum.{'f32' if ty == _F32 else 'f64'}({ty} %x, {ty} 0.0)\n"
                          f"  %r = call {ty} @llvm.minnum.{'f32' if ty == _F32 else 'f64'}({ty} %lo, {ty} 1.0)")}
    binary = {"add": "fadd {ty} {a}, {b}", "mul": "fmul {ty} {a}, {b}", "div": "fdiv {ty} {a}, {b}",
              "fmin": "call {ty} @llvm.minnum." + ("f32" if ty == _F32 else "f64") + "({ty} {a}, {ty} {b})",
              "fmax": "call {ty} @llvm.maxnum." + ("f32" if ty == _F32 else "f64") + "({ty} {a}, {ty} {b})"}
    if op in unary:
        return _unary(name, ty, "  " + unary[op], ftz)
    if op in binary:
        return _binary(name, ty, binary[op], ftz)
    if op == "fma":
        return _ternary_fma(name, ty, ftz)
    return None


_BITS = {
    "d2i.hi": ("i32", ["double"], ["  %b = bitcast double %p0 to i64", "  %s = lshr i64 %b, 32",
                                    "  %r = trunc i64 %s to i32", "  ret i32 %r"]),
    "d2i.lo": ("i32", ["double"], ["  %b = bitcast double %p0 to i64", "  %r = trunc i64 %b to i32", "  ret i32 %r"]),
    "lohi.i2d": ("double", ["i32", "i32"], ["  %lo = zext i32 %p0 to i64", "  %hi = zext i32 %p1 to i64",
                                            "  %h = shl i64 %hi, 32", "  %b = or i64 %h, %lo",
                                            "  %r = bitcast i64 %b to double", "  ret double %r"]),
    "mulhi.i": ("i32", ["i32", "i32"], ["  %a = sext i32 %p0 to i64", "  %b = sext i32 %p1 to i64",
                                        "  %m = mul i64 %a, %b", "  %s = ashr i64 %m, 32", "  %r = trunc i64 %s to i32",
                                        "  ret i32 %r"]),
    "mulhi.ui": ("i32", ["i32", "i32"], ["  %a = zext i32 %p0 to i64", "  %b = zext i32 %p1 to i64",
                                         "  %m = mul i64 %a, %b", "  %s = lshr i64 %m, 32", "  %r = trunc i64 %s to i32",
                                         "  ret i32 %r"]),
}


class Unsupported(Exception):
    """The kernel does something this executor cannot run one thread at a time."""


def _host_module_text(ir_text: str) -> str:
    for marker in REFUSED:
        if marker in ir_text:
            raise Unsupported(f"the kernel uses {marker}")
    text = re.sub(r'^target datalayout = "[^"]*"', f'target datalayout = "{HOST_LAYOUT}"', ir_text, flags=re.M)
    text = re.sub(r'^target triple = "[^"]*"', f'target triple = "{HOST_TRIPLE}"', text, flags=re.M)
    text = re.sub(r"\bptx_kernel ", "", text)
    text = re.sub(r'"(target-cpu|target-features|nvvm\.[a-z]+)"="[^"]*"', "", text)
    text = re.sub(r"^attributes #\d+ = \{\s*\}\n", "", text, flags=re.M)  # emptied groups go, and their uses
    live = set(re.findall(r"^attributes (#\d+) = ", text, flags=re.M))
    text = re.sub(r"(?<![\w\\])#\d+\b", lambda m: m.group(0) if m.group(0) in live else "", text)
    defs: list[str] = []
    for reg in SREGS:
        defs.append(f"@__cpu_{reg} = global [3 x i32] zeroinitializer")
    # inline PTX that headers use for a single instruction: the intrinsic of that instruction
    def asm(m: re.Match) -> str:
        ty, insn = m["ty"], m["insn"]
        op = re.fullmatch(r"(rcp|sqrt|rsqrt|ex2|lg2|sin|cos)\.(approx|rn)(\.ftz)?\.(f32|f64)", insn)
        if not op:
            raise Unsupported(f"inline PTX {insn!r}")
        return f"call {ty} @llvm.nvvm.{op[1]}.{op[2]}{op[3] or ''}.{'f' if op[4] == 'f32' else 'd'}("
    text = re.sub(r'call (?P<ty>float|double) asm "(?P<insn>[a-z0-9.]+) \$0, ?\$1;", "=[fd],[fd]"\(', asm, text)
    if re.search(r"\basm\b", text):
        raise Unsupported("inline PTX")
    used = sorted(set(re.findall(r"@llvm\.nvvm\.([a-z0-9_.]+)\(", text)))
    for name in used:
        full = "llvm.nvvm." + name
        sreg = re.fullmatch(r"read\.ptx\.sreg\.(tid|ntid|ctaid|nctaid)\.([xyz])", name)
        if sreg:
            new = f"__cpu_sreg_{sreg[1]}_{sreg[2]}"
            defs.append(_define(new, "i32", [], [
                f"  %p = getelementptr [3 x i32], ptr @__cpu_{sreg[1]}, i32 0, i32 {'xyz'.index(sreg[2])}",
                "  %r = load i32, ptr %p", "  ret i32 %r"]))
        elif name == "read.ptx.sreg.warpsize":
            new = "__cpu_sreg_warpsize"
            defs.append(_define(new, "i32", [], ["  ret i32 32"]))
        elif name in _BITS:
            new = "__cpu_nvvm_" + name.replace(".", "_")
            ret, params, body = _BITS[name]
            defs.append(_define(new, ret, params, body))
        else:
            d = _math_definition(name)
            if d is None:
                raise Unsupported(f"no host definition for @{full}")
            new = "__cpu_nvvm_" + name.replace(".", "_")
            defs.append(d)
        # the declaration goes; every use calls the definition
        text = re.sub(r"^declare [^\n]*@" + re.escape(full) + r"\([^\n]*\n", "", text, flags=re.M)
        text = re.sub(r"@" + re.escape(full) + r"\(", f"@{new}(", text)
    return text + "\n" + "\n\n".join(defs) + "\n"


@dataclass
class Kernel:
    """A kernel compiled for the host: call it per launch with host buffers and scalars."""

    engine: object
    module: object
    address: int
    param_types: list[str]
    sreg_addresses: dict[str, int]

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list,
               threads: int | None = None) -> None:
        """Run every thread of the launch, in order (or only the first `threads`). `args`:
        ints/floats for scalars (by the parameter's IR type), ctypes arrays or addresses for
        pointers."""
        ctypes_args, argtypes = [], []
        for ty, value in zip(self.param_types, args):
            if ty == "ptr" or ty.startswith("ptr "):
                argtypes.append(ctypes.c_void_p)
                ctypes_args.append(ctypes.addressof(value) if not isinstance(value, int) else value)
            elif ty == "float":
                argtypes.append(ctypes.c_float)
                ctypes_args.append(value)
            elif ty == "double":
                argtypes.append(ctypes.c_double)
                ctypes_args.append(value)
            elif ty in ("i32", "i16", "i8", "i1"):
                argtypes.append(ctypes.c_int32)
                ctypes_args.append(value)
            elif ty == "i64":
                argtypes.append(ctypes.c_int64)
                ctypes_args.append(value)
            else:
                raise Unsupported(f"parameter type {ty}")
        fn = ctypes.CFUNCTYPE(None, *argtypes)(self.address)
        regs = {k: (ctypes.c_int32 * 3).from_address(a) for k, a in self.sreg_addresses.items()}
        regs["ntid"][:] = list(block)
        regs["nctaid"][:] = list(grid)
        left = threads if threads is not None else grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(grid[0]):
                    regs["ctaid"][:] = [bx, by, bz]
                    for tz in range(block[2]):
                        for ty_ in range(block[1]):
                            for tx in range(block[0]):
                                if left == 0:
                                    return
                                left -= 1
                                regs["tid"][:] = [tx, ty_, tz]
                                fn(*ctypes_args)


_initialized = False
_keep_alive: list = []


def _reflect_callback(ftz: int):
    """__nvvm_reflect, which NVVMReflect resolves in a GPU pipeline and a module embedded
    before optimization still calls: __CUDA_ARCH is the sm_90 this runs as, __CUDA_FTZ the
    module's nvvm-reflect-ftz flag."""

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_char_p)
    def reflect(name: bytes) -> int:
        return {b"__CUDA_ARCH": 900, b"__CUDA_FTZ": ftz}.get(name, 0)

    _keep_alive.append(reflect)
    return ctypes.cast(reflect, ctypes.c_void_p).value


def compile_kernel(ir_text: str, kernel_name: str) -> Kernel:
    """The kernel `kernel_name` of an NVPTX module (LLVM's text), built for this CPU."""
    global _initialized  # LLVM's native target, once per process
    if not _initialized:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _initialized = True
    ftz = re.search(r'!"nvvm-reflect-ftz", i32 (\d+)', ir_text)
    llvm.add_symbol("__nvvm_reflect", _reflect_callback(int(ftz.group(1)) if ftz else 0))
    module = llvm.parse_assembly(_host_module_text(ir_text))
    module.verify()
    fn = module.get_function(kernel_name)
    param_types = []
    for arg in fn.arguments:
        param_types.append(str(arg.type))
    tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    sregs = {reg: engine.get_global_value_address(f"__cpu_{reg}") for reg in SREGS}
    return Kernel(engine, module, engine.get_function_address(kernel_name), param_types, sregs)


def floats(values) -> ctypes.Array:
    return (ctypes.c_float * len(values))(*values)


def checksum(array: ctypes.Array) -> bytes:
    return struct.pack(f"<{len(array)}f", *array)
