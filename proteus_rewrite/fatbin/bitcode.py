"""LLVM bitcode of one translation unit: its kernels, their parameters, the device
variables each kernel reaches, launch bounds and Proteus-style ``annotate("jit", ...)``
annotations. llvmlite (LLVM 22) reads the LLVM 19 bitcode clang-19 embeds.

Reading is done on the structured API where llvmlite offers it (functions, arguments,
attributes, globals, types); two facts it does not expose are read from LLVM's own
printout of a single definition: the calling convention (is it a kernel?) and which
globals/functions a function body names (read as @-references, a scan that costs
microseconds where walking every operand through the C API costs milliseconds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import llvmlite.binding as llvm

from ..errors import BitcodeError

KERNEL_CCS = ("ptx_kernel", "amdgpu_kernel")
_REF = re.compile(r'@("(?:[^"\\]|\\[0-9A-Fa-f]{2}|\\\\)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*|\d+)')
_STRATTR = re.compile(r'"([^"]+)"="([^"]*)"')
_ANNOTATION = re.compile(r"\{ ptr (@[^,]+), ptr (@[^,]+), ptr (?:@[^,]+|null), i32 -?\d+, ptr (@[^ }]+|null) \}")
_INT_ELEM = re.compile(r"i(?:8|16|32|64) (-?\d+)")
# an annotation argument: an integer, or a string (upstream's JSON form, {"arg": N, ...})
_ANNOTATION_ARG = re.compile(r"i(?:8|16|32|64) (-?\d+)|ptr (@(?:\"[^\"]+\"|[\w.$]+))")
_IS_CONSTANT = re.compile(r"^[^\[{\"]*\bconstant\b")  # `@g = [linkage...] constant <type>` vs `global`
_CSTRING = re.compile(r'c"((?:[^"\\]|\\[0-9A-Fa-f]{2})*)"')

# Address spaces of variables that live in device memory (not per-block shared memory).
ADDRSPACE_GLOBAL = 1
ADDRSPACE_SHARED = 3
ADDRSPACE_CONSTANT = 4


@dataclass(frozen=True)
class Param:
    index: int
    llvm_type: str  # the value's type; for a byval struct, the struct type (e.g. %struct.Affine)
    kind: str  # int | float | pointer | aggregate | vector | other
    size: int | None  # ABI size in the parameter buffer (None: LLVM could not tell)
    align: int | None
    byval: bool


@dataclass(frozen=True)
class GlobalVar:
    name: str
    addrspace: int
    size: int
    linkage: str
    constant: bool
    declaration: bool


@dataclass(frozen=True)
class BitcodeKernel:
    name: str
    params: tuple[Param, ...]
    globals: tuple[str, ...]  # device variables (__device__, __constant__) it reaches, through its callees
    max_threads: tuple[int, int, int] | None
    min_ctas: int | None
    jit_args: tuple[int, ...] | None  # 1-based, from annotate("jit", ...); None if not annotated


@dataclass(frozen=True)
class BitcodeModule:
    triple: str
    data_layout: str
    source_filename: str
    kernels: dict[str, BitcodeKernel]
    globals: dict[str, GlobalVar]
    undefined_functions: tuple[str, ...]  # declared, not defined, and not intrinsics (rdc: defined in another TU)


def parse(bitcode: bytes, context: llvm.ContextRef | None = None) -> llvm.ModuleRef:
    try:
        return llvm.parse_bitcode(bitcode, context)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown reason"
        raise BitcodeError(f"LLVM cannot parse the embedded bitcode: {first}") from None


def analyze(bitcode: bytes) -> BitcodeModule:
    module = parse(bitcode)
    td = llvm.create_target_data(module.data_layout)

    # By name, all of them: llvmlite's get_global_variable() does not find local (private/internal) ones.
    gvs = {g.name: g for g in module.global_variables}
    globals_: dict[str, GlobalVar] = {}
    for name, g in gvs.items():
        if name.startswith("llvm."):
            continue
        definition = str(g)
        globals_[name] = GlobalVar(
            name=name,
            addrspace=_addrspace(str(g.type)),
            size=td.get_abi_size(g.global_value_type),
            linkage=g.linkage.name,
            constant=_IS_CONSTANT.search(definition.split("=", 1)[-1]) is not None,
            declaration=bool(g.is_declaration),
        )

    refs: dict[str, set[str]] = {}
    kernel_funcs = []
    undefined = []
    for f in module.functions:
        if f.is_declaration:
            if not f.name.startswith("llvm."):
                undefined.append(f.name)
            continue
        text = str(f)
        header = text[text.index("define") : text.index("{", text.index("define"))]
        refs[f.name] = {_unquote(m) for m in _REF.findall(text[len(header) :])}
        if any(f" {cc} " in header for cc in KERNEL_CCS):
            kernel_funcs.append(f)

    annotations = _jit_annotations(gvs)
    kernels = {}
    for f in kernel_funcs:
        attrs = dict(_STRATTR.findall(" ".join(a.decode("utf-8", "replace") for a in f.attributes)))
        kernels[f.name] = BitcodeKernel(
            name=f.name,
            params=tuple(_param(i, a, module, td) for i, a in enumerate(f.arguments)),
            globals=tuple(sorted(_reachable_globals(f.name, refs, globals_))),
            max_threads=_dims(attrs.get("nvvm.maxntid")) or _flat_bound(attrs.get("amdgpu-flat-work-group-size")),
            min_ctas=int(attrs["nvvm.minctasm"]) if attrs.get("nvvm.minctasm", "").isdigit() else None,
            jit_args=annotations.get(f.name),
        )
    return BitcodeModule(
        triple=module.triple,
        data_layout=module.data_layout,
        source_filename=getattr(module, "source_file", "") or "",
        kernels=kernels,
        globals=globals_,
        undefined_functions=tuple(undefined),
    )


def _addrspace(type_text: str) -> int:
    m = re.search(r"addrspace\((\d+)\)", type_text)
    return int(m.group(1)) if m else 0


def _unquote(name: str) -> str:
    if name.startswith('"'):
        return re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name[1:-1])
    return name


# clang's CUDA headers declare these as objects whose members read special registers; a module
# not yet optimized still names the (never defined) objects, which hold nothing.
CUDA_BUILTIN_VARIABLES = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})


def is_device_variable(g: GlobalVar) -> bool:
    """A variable with an identity in device memory, shared by every kernel of the module:
    what a JIT copy of the kernel must use rather than duplicate. Per-block __shared__
    memory (addrspace 3) is not one, and an immutable module-private constant (a string
    literal) may be duplicated freely."""
    if g.addrspace not in (ADDRSPACE_GLOBAL, ADDRSPACE_CONSTANT):
        return False
    if g.declaration and g.name in CUDA_BUILTIN_VARIABLES and g.linkage == "external_weak":
        return False
    return not (g.constant and g.linkage in ("private", "internal"))


def _reachable_globals(root: str, refs: dict[str, set[str]], globals_: dict[str, GlobalVar]) -> set[str]:
    seen, stack, found = {root}, [root], set()
    while stack:
        for name in refs.get(stack.pop(), ()):
            if name in globals_:
                if is_device_variable(globals_[name]):
                    found.add(name)
            elif name in refs and name not in seen:
                seen.add(name)
                stack.append(name)
    return found


def _param(index: int, arg, module: llvm.ModuleRef, td: llvm.TargetData) -> Param:
    attrs = [a.decode("utf-8", "replace") for a in arg.attributes]
    # AMDGPU passes a struct argument `byref` (a pointer into the kernarg segment), NVPTX `byval`:
    # either way the parameter buffer holds the struct itself.
    byval = next((a[len("byval(") : -1] for a in attrs if a.startswith(("byval(", "byref("))), None)
    align = next((int(a.split()[1]) for a in attrs if re.fullmatch(r"align \d+", a)), None)
    if byval is not None:
        size = natural_align = None
        if byval.startswith("%"):
            try:
                ty = module.get_struct_type(_unquote(byval[1:]))
                size, natural_align = td.get_abi_size(ty), td.get_abi_alignment(ty)
            except NameError:
                pass
        return Param(index, byval, "aggregate", size, align or natural_align, True)
    type_text = str(arg.type)
    return Param(index, type_text, _kind(type_text), td.get_abi_size(arg.type), td.get_abi_alignment(arg.type), False)


def _kind(type_text: str) -> str:
    if re.fullmatch(r"i\d+", type_text):
        return "int"
    if type_text in ("half", "bfloat", "float", "double", "fp128"):
        return "float"
    if type_text.startswith("ptr"):
        return "pointer"
    if type_text.startswith("<"):
        return "vector"
    if type_text.startswith(("{", "%", "[")):
        return "aggregate"
    return "other"


def _dims(value: str | None) -> tuple[int, int, int] | None:
    if not value:
        return None
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        return None
    return tuple((parts + [1, 1, 1])[:3])  # type: ignore[return-value]


def _flat_bound(value: str | None) -> tuple[int, int, int] | None:
    """AMDGPU's "amdgpu-flat-work-group-size"="MIN,MAX" as (MAX, 1, 1); HIP's default
    1,1024 (on every kernel without __launch_bounds__) is not a declared bound."""
    if not value:
        return None
    try:
        hi = int(value.split(",")[-1])
    except ValueError:
        return None
    return None if hi == 1024 else (hi, 1, 1)


def _jit_annotations(gvs: dict) -> dict[str, tuple[int, ...]]:
    """{kernel: 1-based argument indices} from annotate("jit", i, j, ...) on kernels; an argument
    may also be upstream's JSON string, R"({"arg": i})", whose `arg` is taken where it names a
    scalar (no `type`, or a scalar one: upstream's arrays and objects are not folded here)."""
    table = gvs.get("llvm.global.annotations")
    if table is None:
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for fn, text_ref, args_ref in _ANNOTATION.findall(str(table)):
        if _global_cstring(gvs, text_ref) != "jit":
            continue
        indices: tuple[int, ...] = ()
        args = gvs.get(_unquote(args_ref[1:])) if args_ref != "null" else None
        if args is not None:
            found = []
            for number, ref in _ANNOTATION_ARG.findall(str(args).split("constant", 1)[-1]):
                if number:
                    found.append(int(number))
                elif (arg := _json_arg(_global_cstring(gvs, ref))) is not None:
                    found.append(arg)
            indices = tuple(found)
        out[_unquote(fn[1:])] = indices
    return out


# upstream's RuntimeConstantType (include/proteus/CompilerInterfaceTypes.h): the scalar kinds
# BOOL .. LONG_DOUBLE are 1 to 7; PTR, STATIC_ARRAY, VECTOR, ARRAY and OBJECT are not folded here
_SCALAR_TYPES = range(1, 8)


def _json_arg(text: str | None) -> int | None:
    try:
        doc = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("arg"), int):
        return None
    return doc["arg"] if doc.get("type") is None or doc.get("type") in _SCALAR_TYPES else None


def _global_cstring(gvs: dict, ref: str) -> str | None:
    g = gvs.get(_unquote(ref[1:]))
    if g is None:
        return None
    m = _CSTRING.search(str(g))
    if not m:
        return None
    raw = re.sub(r"\\([0-9A-Fa-f]{2})", lambda x: chr(int(x.group(1), 16)), m.group(1))
    return raw.rstrip("\0")
