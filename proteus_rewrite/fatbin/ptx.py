"""PTX text: entry points with their parameter layout, and the LLVM bitcode clang embeds as
`.global .align 1 .b8 llvm_$_embedded_$_module[N] = {66, 67, ...};` when building with
-fembed-bitcode. The layout is used when a fat binary has no cubin (PTX-only builds, or a
cubin that lost the symbols).

For the PTX code kind (a kernel with no bitcode, as nvcc builds them, specialized from the
PTX its fat binary carries beside the SASS: jit/ptx_route.py) the module's structure too:
its top-level items, each function's body, each entry's parameters (their PTX types, whether
the entry takes a parameter's address) and the device variables an entry reaches."""

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
    source: bytes = b""  # the PTX as the fat binary held it (decompressed)


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
        source=data,
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


# ---------------------------------------------------------------------------------------------
# The module's structure, for the PTX code kind (nvcc builds): top-level items in order, each
# function's body, what each entry's parameters are and which device variables it reaches.

_COMMENT = re.compile(r"(\"(?:[^\"\\\n]|\\.)*\")|//[^\n]*|/\*.*?\*/", re.S)  # strings kept: a .file path may hold //
_FUNC_HEAD = re.compile(r"(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\b")
_FUNC_NAME = re.compile(r"\.(?:entry|func)\s*(?:\([^)]*\)\s*)?([\w$.]+)")
_VARIABLE = re.compile(r"^(?:\.(?:visible|weak|extern)\s+)*\.(global|const)\s+(.*?)([\w$.]+)\s*(?:\[[^\]]*\])*\s*(?:=.*)?;$", re.S)
_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([\w$.]+)")
_SECTION = re.compile(r"\.section\s+[\w.$]+\s*\{")
_LINE_DIRECTIVE = re.compile(r"\.(?:version|target|address_size|file|loc)\b[^\n;]*(?:;|$)", re.M)
_IDENT = re.compile(r"[A-Za-z_$][\w$.]*")
_LD_PARAM = re.compile(r"^\s*ld\.param(?:\.v(\d))?\.(\w+)\s+(\{[^}]*\}|[^,]+),\s*\[([\w$.]+)(?:\s*\+\s*(\d+))?\]\s*;\s*$", re.M)

_SCALAR_KINDS = {
    "f32": ("float", "float"), "f64": ("float", "double"), "f16": ("float", "half"), "bf16": ("float", "bfloat"),
    "u8": ("int", "i8"), "s8": ("int", "i8"), "b8": ("int", "i8"),
    "u16": ("int", "i16"), "s16": ("int", "i16"), "b16": ("int", "i16"),
    "u32": ("int", "i32"), "s32": ("int", "i32"), "b32": ("int", "i32"),
}
# Functions PTX calls that the assembler and driver provide (printf, device malloc, assert)
SYSTEM_CALLS = frozenset({"vprintf", "malloc", "free", "__assertfail", "__assert_fail"})
# C++ parameter types (as demangled) that a 64-bit PTX parameter may hold as an integer; any
# other 64-bit parameter is taken for a pointer and never folded
_INT64_TYPES = {"long", "unsigned long", "long long", "unsigned long long", "__int64", "unsigned __int64"}


@dataclass(frozen=True)
class Item:
    """A top-level item of a PTX module, as text: a directive, a variable, or a function."""

    text: str
    kind: str  # "function", "prototype", "variable", "directive"
    name: str | None = None
    space: str | None = None  # variables: "global" or "const"
    body: tuple[int, int] | None = None  # functions: the body's span in `text`, braces excluded
    is_entry: bool = False


@dataclass(frozen=True)
class PtxParam:
    """One `.param` of an entry: its PTX type, whether the entry ever takes its address (then it
    can only be read as it is: the PTX route never folds it), and its record kind."""

    name: str
    ptx_type: str  # "u32", "f64", ... or "b8[16]" for a by-value aggregate
    size: int
    offset: int
    addressed: bool


def strip_comments(text: str) -> str:
    return _COMMENT.sub(lambda m: m.group(1) or "", text)


def items(text: str) -> list[Item]:
    """The module's top-level items in order. Comments must be gone (strip_comments)."""
    out: list[Item] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        head = _FUNC_HEAD.match(text, i)
        if head is not None:
            semi = text.find(";", i)
            brace = text.find("{", i)
            if brace < 0 or (0 <= semi < brace and not _opens_body(text, i, semi)):
                end = semi + 1
                name = _FUNC_NAME.search(text, i, end)
                out.append(Item(text[i:end], "prototype", name.group(1) if name else None))
                i = end
                continue
            close = _matching_brace(text, brace)
            whole = text[i:close + 1]
            name = _FUNC_NAME.search(text, i, brace)
            if name is None:
                raise FormatError(f"PTX function at offset {i}: no name")
            out.append(Item(whole, "function", name.group(1), body=(brace - i + 1, close - i),
                            is_entry=head.group(1) == "entry"))
            i = close + 1
            continue
        section = _SECTION.match(text, i)
        if section is not None:  # debug sections (-lineinfo, -G): a brace block, no `;`
            close = _matching_brace(text, section.end() - 1)
            out.append(Item(text[i:close + 1], "directive"))
            i = close + 1
            continue
        line = _LINE_DIRECTIVE.match(text, i)
        if line is not None:  # .version, .target, .address_size, .file: one line, no `;`
            out.append(Item(line.group(0), "directive"))
            i = line.end()
            continue
        end = text.find(";", i)
        if end < 0:
            raise FormatError(f"PTX: unterminated statement at offset {i}")
        end = _statement_end(text, i, end)
        stmt = text[i:end + 1]
        var = _VARIABLE.match(stmt.strip())
        if var is not None:
            out.append(Item(stmt, "variable", var.group(3), space=var.group(1)))
        else:
            out.append(Item(stmt, "directive"))
        i = end + 1
    return out


def _opens_body(text: str, start: int, semi: int) -> bool:
    # a `;` inside the parameter list's parentheses does not end a prototype
    return text.count("(", start, semi) > text.count(")", start, semi)


def _statement_end(text: str, start: int, semi: int) -> int:
    # an initializer's braces may hold no `;`, but a `;` inside them would not end the statement
    while text.count("{", start, semi) > text.count("}", start, semi):
        semi = text.find(";", semi + 1)
        if semi < 0:
            raise FormatError(f"PTX: unterminated initializer at offset {start}")
    return semi


def _matching_brace(text: str, open_: int) -> int:
    depth = 0
    for m in re.finditer(r"[{}]", text[open_:]):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return open_ + m.start()
    raise FormatError(f"PTX: unbalanced braces from offset {open_}")


def body(item: Item) -> str:
    assert item.body is not None
    return item.text[item.body[0]:item.body[1]]


def callees(item: Item) -> set[str]:
    return set(_CALL.findall(body(item))) if item.kind == "function" else set()


def reached(items_: list[Item], entry: str) -> list[Item]:
    """The entry and every function it calls or takes the address of (an indirect call's
    target), directly or not, in module order."""
    functions = {it.name: it for it in items_ if it.kind == "function"}
    seen, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo.extend(tok for tok in _IDENT.findall(body(functions[name])) if tok in functions)
    return [it for it in items_ if it.kind == "function" and it.name in seen]


def variables_used(items_: list[Item], functions: list[Item]) -> list[Item]:
    """The module's `.global`/`.const` variables those functions name, in module order."""
    variables = {it.name: it for it in items_ if it.kind == "variable" and it.space in ("global", "const")}
    used: set[str] = set()
    for f in functions:
        used.update(tok for tok in _IDENT.findall(body(f)) if tok in variables)
    return [variables[n] for n in variables if n in used]


def entry_params(item: Item) -> list[PtxParam]:
    """An entry's parameters as its signature declares them, and which it takes the address of."""
    sig = item.text[: item.body[0]]
    m = re.search(r"\(([^)]*)\)", sig[sig.find(item.name):])
    params, offset = [], 0
    text = body(item)
    for pm in re.finditer(r"\.param\s+(?:\.align\s+(\d+)\s+)?((?:\.\w+\s+)*?)\.(\w+)\s+([\w$.]+)(?:\[(\d+)\])?",
                          m.group(1) if m else ""):
        align_txt, _quals, ptype, name, count = pm.groups()
        elem = _TYPE_SIZES.get(re.sub(r"\D", "", ptype))
        if elem is None:
            raise FormatError(f"PTX entry {item.name}: unknown parameter type .{ptype}")
        size = elem * (int(count) if count else 1)
        align = int(align_txt) if align_txt else elem
        offset = (offset + align - 1) // align * align
        loads = sum(1 for lm in _LD_PARAM.finditer(text) if lm.group(4) == name)
        mentions = len(re.findall(r"(?<![\w$.])" + re.escape(name) + r"(?![\w$.])", text))
        params.append(PtxParam(name, f"{ptype}[{count}]" if count else ptype, size, offset, mentions > loads))
        offset += size
    return params


def param_kind(p: PtxParam, cxx_type: str | None) -> tuple[str, str | None]:
    """(record kind, LLVM-style type name) of an entry parameter for the PTX code kind."""
    if p.addressed:
        return "other", None
    if "[" in p.ptx_type:
        return "aggregate", None
    if p.ptx_type in _SCALAR_KINDS:
        return _SCALAR_KINDS[p.ptx_type]
    if p.ptx_type in ("u64", "s64", "b64"):
        if cxx_type is not None and cxx_type.replace("const", "").strip() in _INT64_TYPES:
            return "int", "i64"
        return "pointer", None
    return "other", None


def cxx_parameter_types(demangled: str) -> list[str] | None:
    """The parameter types of a demangled C++ function name, or None (extern "C", or not parsed)."""
    if not demangled.endswith(")"):
        return None
    depth, start = 0, None
    for i in range(len(demangled) - 1, -1, -1):
        c = demangled[i]
        if c in ")>":
            depth += 1
        elif c in "(<":
            depth -= 1
            if depth == 0 and c == "(":
                start = i
                break
    if start is None:
        return None
    out = split_top_level(demangled[start + 1:-1], "(<", ")>")
    return [] if out == ["void"] else out


def split_top_level(text: str, opens: str, closes: str) -> list[str]:
    """`text` split at the commas outside any bracket pair (a C++ parameter list's template
    arguments, a PTX instruction's vector and address operands), each part stripped."""
    out, depth, cur = [], 0, ""
    for c in text:
        if c in opens:
            depth += 1
        elif c in closes:
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


@dataclass(frozen=True)
class PtxKernel:
    """What the PTX code kind records of one entry: its parameters' kinds and the device
    variables it and its callees name."""

    name: str
    params: tuple[PtxParam, ...]
    kinds: tuple[tuple[str, str | None], ...]  # (record kind, LLVM-style type) per parameter
    variables: tuple[str, ...]
    # functions it calls that this module declares but does not define (-rdc: another
    # translation unit's), other than the ones the assembler provides
    unresolved: tuple[str, ...] = ()


def analyze(data: bytes) -> dict[str, PtxKernel]:
    """Every entry defined in a PTX module, for specializing from its PTX."""
    from .common import demangle  # cxxfilt: only where a PTX module is analyzed

    text = strip_comments(data.decode("utf-8", "replace"))
    module = items(text)
    out = {}
    for it in module:
        if not it.is_entry:
            continue
        params = entry_params(it)
        cxx = cxx_parameter_types(demangle(it.name)) if it.name.startswith("_Z") else None
        if cxx is not None and len(cxx) != len(params):
            cxx = None
        kinds = tuple(param_kind(p, cxx[i] if cxx else None) for i, p in enumerate(params))
        functions = reached(module, it.name)
        variables = tuple(v.name for v in variables_used(module, functions))
        defined = {f.name for f in module if f.kind == "function"}
        unresolved = sorted(set().union(*(callees(f) for f in functions)) - defined - SYSTEM_CALLS)
        out[it.name] = PtxKernel(it.name, tuple(params), kinds, variables, tuple(unresolved))
    return out


def _extern(it: Item) -> bool:
    return bool(re.match(r"\s*\.extern\b", it.text))


def _exported(it: Item) -> bool:
    return bool(re.match(r"\s*\.(?:visible|weak)\b", it.text))


def link(units: list[str], home: int, entry: str) -> str | None:
    """-rdc=true builds: `entry`'s translation unit with the definitions it reaches in the
    other units (the functions it calls there and what they reach, the variables they name) as
    one module, what a whole-program assembler takes; None when a name it needs is defined by no
    unit, or two units define one name differently."""
    parsed = [items(strip_comments(u)) for u in units]
    base = parsed[home]
    functions = {it.name: it for it in base if it.kind == "function"}
    variables = {it.name: it for it in base if it.kind == "variable" and not _extern(it)}
    defined_fn: dict[str, Item] = {}
    defined_var: dict[str, Item] = {}
    for i, unit in enumerate(parsed):
        for it in unit:
            if i != home and it.kind == "function" and not it.is_entry and _exported(it):
                defined_fn.setdefault(it.name, it)
            if it.kind == "variable" and not _extern(it) and _exported(it):
                defined_var.setdefault(it.name, it)
    unit_of = {id(it): i for i, unit in enumerate(parsed) for it in unit}
    new_fns: dict[str, Item] = {}
    new_vars: dict[str, Item] = {}
    todo = sorted(set().union(*(callees(f) for f in reached(base, entry))) - set(functions) - SYSTEM_CALLS)
    while todo:
        name = todo.pop()
        if name in functions or name in new_fns or name in SYSTEM_CALLS:
            continue
        if name not in defined_fn:
            return None
        unit = parsed[unit_of[id(defined_fn[name])]]
        own = {it.name for it in unit if it.kind == "function"}
        pulled = reached(unit, name)
        for f in pulled:
            if f.name in functions:
                if functions[f.name].text != f.text:
                    return None
                continue
            if new_fns.setdefault(f.name, f).text != f.text:
                return None
            todo.extend(c for c in callees(f) if c not in own)
        for v in variables_used(unit, pulled):
            if _extern(v):
                v = defined_var.get(v.name)
                if v is None:
                    return None
            if v.name in variables:
                if variables[v.name].text != v.text:
                    return None
                continue
            if new_vars.setdefault(v.name, v).text != v.text:
                return None
    if not new_fns:
        return None
    out, placed = [], False
    for it in base:
        if it.name in new_fns and it.kind == "prototype" or it.name in new_vars and it.kind == "variable":
            continue  # the definition comes instead
        if not placed and it.kind in ("function", "prototype"):
            # declared before any use; defined after the unit's own functions, which they may call
            out += [v.text for v in new_vars.values()]
            out += [f.text[: f.body[0] - 1].rstrip() + ";" for f in new_fns.values()]
            placed = True
        out.append(it.text)
    out += [f.text for f in new_fns.values()]
    return "\n".join(s.strip("\n") for s in out) + "\n"
