"""ELF64 little-endian images (cubins, AMDGPU code objects) read and patched with struct alone:
the run time patches every variant it loads, and must not import LIEF for that."""

from __future__ import annotations

import struct

from ..errors import FormatError

SHT_SYMTAB = 2
SHT_NOBITS = 8


def sections(data: bytes) -> list[tuple]:
    """The section headers, each (name offset, type, flags, addr, offset, size, link, info,
    addralign, entsize)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FormatError("not a 64-bit little-endian ELF image")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def body(data: bytes, header: tuple) -> bytes:
    return data[header[4] : header[4] + header[5]]


def cstr(table: bytes, off: int) -> str:
    return table[off : table.index(b"\0", off)].decode("utf-8", "replace")


def section_name(data: bytes, headers: list[tuple], header: tuple) -> str:
    shstrndx, = struct.unpack_from("<H", data, 0x3E)
    return cstr(body(data, headers[shstrndx]), header[0])


def symbols(data: bytes, headers: list[tuple]) -> list[tuple[str, int, int, int]]:
    """The symbol table's entries in order (their index is what .nv.info records name), each
    (name, section index, value, size); empty without a symbol table."""
    symtab = next((h for h in headers if h[1] == SHT_SYMTAB), None)
    if symtab is None:
        return []
    strtab, raw = body(data, headers[symtab[6]]), body(data, symtab)
    out = []
    for i in range(0, len(raw) - 23, 24):
        st_name, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", raw, i)
        out.append((cstr(strtab, st_name), shndx, value, size))
    return out


def symbol_offsets(data: bytes, names: set[str]) -> dict[str, tuple[int, int]]:
    """Where each named symbol's bytes lie in the file: name -> (offset, size). Symbols of
    sections without file bytes (.bss, .nv.global) and names not found are left out."""
    try:
        headers = sections(data)
        found: dict[str, tuple[int, int]] = {}
        for name, shndx, value, size in symbols(data, headers):
            if name not in names or not 0 < shndx < len(headers) or headers[shndx][1] == SHT_NOBITS:
                continue
            sec = headers[shndx]
            offset = sec[4] + value - sec[3]  # a cubin's sections sit at address 0; a code object's do not
            if not sec[4] <= offset <= offset + size <= sec[4] + sec[5] <= len(data):
                raise FormatError(f"symbol {name} lies outside its section")
            found[name] = (offset, size)
        return found
    except (struct.error, IndexError, ValueError) as exc:
        raise FormatError(f"malformed ELF image ({exc})") from None


def patch_symbols(data: bytes, values: dict[str, bytes]) -> bytes:
    """`data` with each named symbol's bytes replaced by `values[name]` (of the symbol's size);
    names the image does not define with file bytes are skipped."""
    out = bytearray(data)
    for name, (offset, size) in symbol_offsets(data, set(values)).items():
        if len(values[name]) != size:
            raise FormatError(f"symbol {name} has {size} bytes, not {len(values[name])}")
        out[offset : offset + size] = values[name]
    return bytes(out)
