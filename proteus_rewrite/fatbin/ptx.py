"""PTX text: entry points with their parameter layout, and the LLVM bitcode clang embeds as
`.global .align 1 .b8 llvm_$_embedded_$_module[N] = {66, 67, ...};` when building with
-fembed-bitcode. Used when a fat binary has no cubin (PTX-only builds, or a cubin that
lost the symbols)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import FormatError
from .cubin import EMBEDDED_CMDLINE, EMBEDDED_MODULE, CubinParam, EmbeddedModule

_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)([^{;]*)\{")  # definitions, not `.entry f(...);` declarations
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?((?:\.\w+\s+)*?)\.(\w+)\s+[\w$.]+(?:\[(\d+)\])?")
_DIRECTIVE3 = r"\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?"
_MAXNTID = re.compile(r"\.maxntid" + _DIRECTIVE3)
_REQNTID = re.compile(r"\.reqntid" + _DIRECTIVE3)
_MINCTA = re.compile(r"\.minnctapersm\s+(\d+)")
_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.M)
_TARGET = re.compile(r"^\s*\.target\s+([\w,\s]+?)\s*$", re.M)
_ARRAY = r"\.global\s+(?:\.align\s+\d+\s+)?\.b8\s+{name}\[(\d+)\]\s*=\s*\{{([^}}]*)\}}"
_MODULE = re.compile(_ARRAY.format(name=re.escape(EMBEDDED_MODULE)).encode())
_CMDLINE = re.compile(_ARRAY.format(name=re.escape(EMBEDDED_CMDLINE)).encode())

_TYPE_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}


@dataclass(frozen=True)
class PtxEntry:
    name: str
    params: tuple[CubinParam, ...]
    param_size: int
    max_threads: tuple[int, int, int] | None
    reqntid: tuple[int, int, int] | None
    min_ctas: int | None


@dataclass(frozen=True)
class Ptx:
    version: tuple[int, int] | None
    target: str | None
    entries: dict[str, PtxEntry]
    modules: tuple[EmbeddedModule, ...]


def parse(data: bytes) -> Ptx:
    modules = []
    cmdlines = [tuple(a.decode("utf-8", "replace") for a in blob.split(b"\0") if a) for blob in _arrays(_CMDLINE, data)]
    for i, bc in enumerate(_arrays(_MODULE, data)):
        modules.append(EmbeddedModule(bc, cmdlines[i] if i < len(cmdlines) else ()))

    # Everything but the (possibly huge) byte arrays is small: decode only what is needed.
    text = _MODULE.sub(b"", _CMDLINE.sub(b"", data)).decode("utf-8", "replace")
    version = _VERSION.search(text)
    target = _TARGET.search(text)
    entries = {}
    for m in _ENTRY.finditer(text):
        entries[m.group(1)] = _entry(m.group(1), m.group(2), m.group(3))
    return Ptx(
        version=(int(version.group(1)), int(version.group(2))) if version else None,
        target=target.group(1) if target else None,
        entries=entries,
        modules=tuple(modules),
    )


def _arrays(pattern: re.Pattern, data: bytes) -> list[bytes]:
    out = []
    for m in pattern.finditer(data):
        size = int(m.group(1))
        try:
            blob = bytes(map(int, m.group(2).split(b",")))
        except ValueError as exc:
            raise FormatError(f"PTX array {pattern.pattern[:40]!r}: not a list of bytes ({exc})") from None
        if len(blob) > size:
            raise FormatError(f"PTX byte array declares {size} bytes but lists {len(blob)}")
        out.append(blob + bytes(size - len(blob)))  # PTX zero-fills a short initializer
    return out


def _dims(m: re.Match | None) -> tuple[int, int, int] | None:
    if m is None:
        return None
    return tuple(int(g) if g else 1 for g in m.groups())  # type: ignore[return-value]


def _entry(name: str, params_text: str, directives: str) -> PtxEntry:
    params = []
    offset = 0
    for ordinal, m in enumerate(_PARAM.finditer(params_text)):
        align_txt, _qualifiers, ptype, count = m.groups()
        bits = re.sub(r"\D", "", ptype)
        elem = _TYPE_SIZES.get(bits)
        if elem is None:
            raise FormatError(f"PTX entry {name}: unknown parameter type .{ptype}")
        size = elem * (int(count) if count else 1)
        align = int(align_txt) if align_txt else elem
        offset = (offset + align - 1) // align * align
        params.append(CubinParam(ordinal, offset, size))
        offset += size
    mincta = _MINCTA.search(directives)
    return PtxEntry(
        name=name,
        params=tuple(params),
        param_size=offset,
        max_threads=_dims(_MAXNTID.search(directives)),
        reqntid=_dims(_REQNTID.search(directives)),
        min_ctas=int(mincta.group(1)) if mincta else None,
    )
