"""AMDGPU code objects (the `hipv4-amdgcn-amd-amdhsa--gfxX` entries of an offload bundle):
target, kernels with their kernarg layout, and the embedded bitcode.

A code object is an ELF shared object (EM_AMDGPU). What is read, and from where:
  target      e_flags: EF_AMDGPU_MACH (low byte) names the processor, bits 8-11 the
              xnack/sramecc settings (code object v4 and later)
  kernels     the NT_AMDGPU_METADATA note (owner "AMDGPU", type 32): a MessagePack map whose
              `amdhsa.kernels` lists each kernel's name, descriptor symbol (`NAME.kd`),
              arguments (`.args`: offset, size, value kind) and limits; code object v2's
              YAML note is not read (clang-19 cannot emit it)
  bitcode     `.llvmbc` (the module handed to the backend) and `.llvmcmd` (its cc1 flags,
              NUL-separated), both written by -fembed-bitcode
lief parses the ELF (and leaves AMDGPU notes to us as raw descriptions); msgpack decodes
the metadata.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import lief
import msgpack

from ..errors import FormatError

lief.logging.disable()

NT_AMDGPU_METADATA = 32
EF_AMDGPU_MACH = 0xFF
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00
# EF_AMDGPU_MACH_* from LLVM's llvm/BinaryFormat/ELF.h (LLVM 19); 0 means no processor named.
MACHS = {
    0x020: "gfx600", 0x021: "gfx601", 0x022: "gfx700", 0x023: "gfx701", 0x024: "gfx702", 0x025: "gfx703",
    0x026: "gfx704", 0x028: "gfx801", 0x029: "gfx802", 0x02A: "gfx803", 0x02B: "gfx810", 0x02C: "gfx900",
    0x02D: "gfx902", 0x02E: "gfx904", 0x02F: "gfx906", 0x030: "gfx908", 0x031: "gfx909", 0x032: "gfx90c",
    0x033: "gfx1010", 0x034: "gfx1011", 0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032",
    0x039: "gfx1033", 0x03A: "gfx602", 0x03B: "gfx705", 0x03C: "gfx805", 0x03D: "gfx1035", 0x03E: "gfx1034",
    0x03F: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100", 0x042: "gfx1013", 0x043: "gfx1150", 0x044: "gfx1103",
    0x045: "gfx1036", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200", 0x04A: "gfx1151", 0x04B: "gfx941",
    0x04C: "gfx942", 0x04E: "gfx1201", 0x051: "gfx9-generic", 0x052: "gfx10-1-generic", 0x053: "gfx10-3-generic",
    0x054: "gfx11-generic", 0x055: "gfx1152", 0x059: "gfx12-generic",
}
# Kernel arguments the HIP runtime fills in itself; the app passes only the others.
HIDDEN_PREFIX = "hidden_"
MAX_KERNELS = 1 << 16


@dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str  # by_value, global_buffer, hidden_block_count_x, ...
    address_space: str | None = None
    name: str | None = None

    @property
    def hidden(self) -> bool:
        return self.value_kind.startswith(HIDDEN_PREFIX)


@dataclass(frozen=True)
class KernelMeta:
    name: str
    symbol: str  # the kernel descriptor, NAME.kd
    args: tuple[KernelArg, ...]  # explicit and hidden, in kernarg order
    kernarg_size: int
    kernarg_align: int
    max_flat_workgroup_size: int | None
    reqd_workgroup_size: tuple[int, int, int] | None
    wavefront_size: int | None
    sgpr_count: int | None
    vgpr_count: int | None
    group_segment_size: int | None  # static LDS bytes
    private_segment_size: int | None  # scratch bytes per work-item

    @property
    def params(self) -> tuple[KernelArg, ...]:
        """What the app passes (hipLaunchKernel's args): the explicit arguments."""
        return tuple(a for a in self.args if not a.hidden)

    @property
    def param_size(self) -> int:
        return max((a.offset + a.size for a in self.params), default=0)


@dataclass(frozen=True)
class Metadata:
    version: tuple[int, ...]  # amdhsa.version: (1, 1) code object v4, (1, 2) v5, (1, 3) v6
    target: str  # amdhsa.target, e.g. amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-
    kernels: tuple[KernelMeta, ...]


@dataclass(frozen=True)
class CodeObject:
    arch: str  # from e_flags; "" when the header names no processor
    xnack: str  # "any", "off", "on" or "unsupported"
    sramecc: str
    abi_version: int  # e_ident[EI_ABIVERSION]: 2 = code object v4, 3 = v5, 4 = v6
    metadata: Metadata
    bitcode: bytes | None = field(repr=False)
    cmdline: tuple[str, ...]
    descriptors: tuple[str, ...]  # `.kd` symbols defined in the dynamic symbol table

    @property
    def kernels(self) -> dict[str, KernelMeta]:
        return {k.name: k for k in self.metadata.kernels}


def parse(data: bytes) -> CodeObject:
    """Parse one code object. Raises FormatError for anything that is not a readable one."""
    if data[:4] != b"\x7fELF":
        raise FormatError("AMDGPU code object: not an ELF file")
    binary = lief.ELF.parse(io.BytesIO(data))
    if binary is None:
        raise FormatError("AMDGPU code object: corrupt ELF (LIEF could not parse it)")
    try:
        return _collect(binary, data)
    except FormatError:
        raise
    except (TypeError, ValueError, IndexError, OverflowError, UnicodeDecodeError, AttributeError) as exc:
        # LIEF hands back odd values for a mangled file (bytes for names, out-of-range enums)
        raise FormatError(f"AMDGPU code object: corrupt ELF ({type(exc).__name__})") from None


def _collect(binary, data: bytes) -> CodeObject:
    hdr = binary.header
    if getattr(hdr.machine_type, "name", None) != "AMDGPU":
        raise FormatError(f"AMDGPU code object: ELF machine is {getattr(hdr.machine_type, 'name', hdr.machine_type)}, not AMDGPU")
    flags = int(hdr.processor_flag)
    note = next((n for n in binary.notes if _text(n.name).rstrip("\0") == "AMDGPU" and int(n.original_type) == NT_AMDGPU_METADATA), None)
    if note is None:
        raise FormatError("AMDGPU code object: no NT_AMDGPU_METADATA note (code object v2, or not built by clang?)")
    sections = {}
    for s in binary.sections:
        if isinstance(s.name, str) and s.name in (".llvmbc", ".llvmcmd") and s.name not in sections:
            if s.file_offset + s.size > len(data):
                raise FormatError(f"AMDGPU code object: section {s.name} extends past the end of the code object")
            sections[s.name] = data[s.file_offset : s.file_offset + s.size]
    cmd = sections.get(".llvmcmd", b"")
    descriptors = tuple(sorted(s.name for s in binary.dynamic_symbols
                               if isinstance(s.name, str) and s.name.endswith(".kd") and s.shndx != 0))
    return CodeObject(
        arch=MACHS.get(flags & EF_AMDGPU_MACH, ""),
        xnack=_feature(flags & EF_AMDGPU_FEATURE_XNACK_V4, 0x100),
        sramecc=_feature(flags & EF_AMDGPU_FEATURE_SRAMECC_V4, 0x400),
        abi_version=int(hdr.identity_abi_version),
        metadata=parse_metadata(bytes(note.description)),
        bitcode=sections.get(".llvmbc"),
        cmdline=tuple(a.decode("utf-8", "replace") for a in cmd.split(b"\0") if a),
        descriptors=descriptors,
    )


def _text(value) -> str:
    # LIEF keeps a note's NUL terminator when parsing from memory, and hands back bytes for
    # names that are not valid UTF-8.
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def _feature(bits: int, unit: int) -> str:
    return ("unsupported", "any", "off", "on")[bits // unit]


def parse_metadata(blob: bytes) -> Metadata:
    """The NT_AMDGPU_METADATA note's description (MessagePack) -> Metadata."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(blob), 1))
    try:
        unpacker.feed(blob)
        doc = unpacker.unpack()
        rest = blob[unpacker.tell():]
    except msgpack.OutOfData:
        raise FormatError("AMDGPU metadata note is truncated MessagePack") from None
    except (msgpack.FormatError, msgpack.StackError, msgpack.BufferFull, ValueError, UnicodeDecodeError, TypeError) as exc:
        raise FormatError(f"AMDGPU metadata note is not valid MessagePack ({type(exc).__name__})") from None
    if rest.strip(b"\0"):  # a note's description is padded to 4 bytes; anything else is not ours
        raise FormatError(f"AMDGPU metadata note has {len(rest)} bytes after its MessagePack map")
    if not isinstance(doc, dict):
        raise FormatError("AMDGPU metadata note is not a map")
    kernels = doc.get("amdhsa.kernels", [])
    if not isinstance(kernels, list) or len(kernels) > MAX_KERNELS:
        raise FormatError("AMDGPU metadata: amdhsa.kernels is not a list of kernels")
    version = doc.get("amdhsa.version", [])
    return Metadata(
        version=tuple(_int(v, "amdhsa.version") for v in version) if isinstance(version, list) else (),
        target=_str(doc.get("amdhsa.target", ""), "amdhsa.target"),
        kernels=tuple(_kernel(i, k) for i, k in enumerate(kernels)),
    )


def _kernel(index: int, k) -> KernelMeta:
    if not isinstance(k, dict):
        raise FormatError(f"AMDGPU metadata: kernel {index} is not a map")
    name = _str(k.get(".name"), f"kernel {index} .name")
    where = f"kernel {name}"
    args = k.get(".args", [])
    if not isinstance(args, list):
        raise FormatError(f"AMDGPU metadata: {where}: .args is not a list")
    parsed = []
    for j, a in enumerate(args):
        if not isinstance(a, dict):
            raise FormatError(f"AMDGPU metadata: {where}: argument {j} is not a map")
        parsed.append(KernelArg(
            offset=_int(a.get(".offset"), f"{where} argument {j} .offset"),
            size=_int(a.get(".size"), f"{where} argument {j} .size"),
            value_kind=_str(a.get(".value_kind"), f"{where} argument {j} .value_kind"),
            address_space=_opt_str(a.get(".address_space"), f"{where} argument {j} .address_space"),
            name=_opt_str(a.get(".name"), f"{where} argument {j} .name"),
        ))
    reqd = k.get(".reqd_workgroup_size")
    if reqd is not None:
        if not isinstance(reqd, list) or len(reqd) != 3:
            raise FormatError(f"AMDGPU metadata: {where}: .reqd_workgroup_size is not three sizes")
        reqd = tuple(_int(v, f"{where} .reqd_workgroup_size") for v in reqd)
    return KernelMeta(
        name=name,
        symbol=_str(k.get(".symbol", name + ".kd"), f"{where} .symbol"),
        args=tuple(parsed),
        kernarg_size=_int(k.get(".kernarg_segment_size", 0), f"{where} .kernarg_segment_size"),
        kernarg_align=_int(k.get(".kernarg_segment_align", 8), f"{where} .kernarg_segment_align"),
        max_flat_workgroup_size=_opt_int(k.get(".max_flat_workgroup_size"), f"{where} .max_flat_workgroup_size"),
        reqd_workgroup_size=reqd,
        wavefront_size=_opt_int(k.get(".wavefront_size"), f"{where} .wavefront_size"),
        sgpr_count=_opt_int(k.get(".sgpr_count"), f"{where} .sgpr_count"),
        vgpr_count=_opt_int(k.get(".vgpr_count"), f"{where} .vgpr_count"),
        group_segment_size=_opt_int(k.get(".group_segment_fixed_size"), f"{where} .group_segment_fixed_size"),
        private_segment_size=_opt_int(k.get(".private_segment_fixed_size"), f"{where} .private_segment_fixed_size"),
    )


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << 32):
        raise FormatError(f"AMDGPU metadata: {what} is not a size ({type(v).__name__})")
    return v


def _opt_int(v, what: str) -> int | None:
    return None if v is None else _int(v, what)


def _str(v, what: str) -> str:
    if not isinstance(v, str):
        raise FormatError(f"AMDGPU metadata: {what} is not a string ({type(v).__name__})")
    return v


def _opt_str(v, what: str) -> str | None:
    return None if v is None else _str(v, what)
