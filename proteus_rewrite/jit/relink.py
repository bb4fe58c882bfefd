"""Device variables (`__device__`, `__constant__`): a variant uses the AOT module's copies, and
finds them through one pointer per variable that is set in the image's bytes as it is loaded.

The addresses are in no instruction, so one compiled image, and one cache entry, serves every
process and context, where the variables' addresses differ: a kernel that uses device
variables is served warm from the disk cache like any other. Upstream Proteus does the same
(CoreLLVMDevice.h, replaceGlobalVariablesWithPointers and relinkGlobalsObject).

In the specialized module's text (ir.py), each variable's definition is dropped, each function
that uses it loads its address from `__proteus_gvar_<i>` at entry (i: its place in the sorted
names), and the constant expressions around the uses (addrspacecast, getelementptr, ...) become
instructions after that load. patch_image() writes the launch's addresses over the placeholder
in a cubin, PTX or AMDGPU code object.
"""

from __future__ import annotations

import re

from ..errors import SpecializeError
from ..fatbin import elf64
from . import codegen

POINTER_PREFIX = "__proteus_gvar_"
PLACEHOLDER = 0xDEADBEEFDEADBEEF  # a non-zero initializer puts the pointer in an initialized section
_LOCAL = "%__pg."
# Constant expressions that have an instruction of the same spelling (less the parentheses).
_OPENER = re.compile(r"(?:getelementptr(?: (?:inbounds|nuw|nusw))*|addrspacecast|bitcast|ptrtoint|inttoptr) $")
_LABEL = re.compile(r"^[-\w$.\"]+:")
_DEFINE = re.compile(r"^define [^\n]*\{\n(.*?)^\}\n", re.M | re.S)


def pointer_name(index: int) -> str:
    return f"{POINTER_PREFIX}{index}"


def load_through_pointers(text: str, names: list[str], what: str, ref, amdgpu: bool) -> str:
    """The module text with every use of the device variables `names` going through their
    pointers. `ref(name)`: the regex of the variable's printed name; `what`: the kernel, for errors."""
    pointers = []
    for i, name in enumerate(names):
        r = ref(name)
        m = re.search(r"^" + r + r" = [^\n]*\n", text, re.M)
        if m is None:
            continue  # pruned: this kernel does not use it
        text = text[: m.start()] + text[m.end():]
        local = f"{_LOCAL}{i}"
        # The AOT variable lives in global memory whatever its address space (a __constant__ is
        # global memory behind the constant cache), so every use goes through a global pointer.
        text = re.sub(r"addrspacecast \(ptr addrspace\(\d+\) " + r + r" to ptr\)",
                      f"addrspacecast (ptr addrspace(1) {local} to ptr)", text)
        text = re.sub(r"ptr addrspace\(1\) " + r, f"ptr addrspace(1) {local}", text)
        if amdgpu:  # AMDGPU's constant address space (4) is the same 64-bit memory as the global one
            text = re.sub(r"ptr addrspace\(4\) " + r, f"ptr addrspace(4) {local}.c", text)
        leftover = re.search(r, text)
        if leftover:
            raise SpecializeError(f"{what}: device variable {name} is used in a form that cannot be redirected: "
                                  f"{_line_at(text, leftover.start()).strip()[:120]}")
        pointers.append(i)
    if not pointers:
        return text
    invariant = 1 + max((int(n) for n in re.findall(r"^!(\d+) = ", text, re.M)), default=-1)
    text = _DEFINE.sub(lambda m: _function(m.group(0), m.group(1), invariant), text)
    outside = re.search(re.escape(_LOCAL) + r"(\d+)", text)
    if outside:
        raise SpecializeError(f"{what}: device variable {names[int(outside.group(1))]}'s address is held by another "
                              f"variable's initializer: {_line_at(text, outside.start()).strip()[:120]}")
    text = text.replace("\x00", _LOCAL)  # uses inside functions, marked by _function
    decls = "".join(f"@{pointer_name(i)} = addrspace(1) externally_initialized global ptr addrspace(1) "
                    f"inttoptr (i64 {PLACEHOLDER} to ptr addrspace(1)), align 8\n" for i in pointers)
    return text + "\n" + decls + f"!{invariant} = !{{}}\n"


def _function(whole: str, body: str, invariant: int) -> str:
    if _LOCAL not in body:
        return whole
    head = whole[: len(whole) - len(body) - 2]  # the define line, through "{\n"
    used = sorted({int(i) for i in re.findall(re.escape(_LOCAL) + r"(\d+)", body)})
    prelude = [f"  {_LOCAL}{i} = load ptr addrspace(1), ptr addrspace(1) @{pointer_name(i)}, align 8, "
               f"!invariant.load !{invariant}" for i in used]
    prelude += [f"  {_LOCAL}{i}.c = addrspacecast ptr addrspace(1) {_LOCAL}{i} to ptr addrspace(4)"
                for i in used if f"{_LOCAL}{i}.c" in body]
    lines, made = [], {}
    for line in body.split("\n"):
        lines.append(_expand(line, made, prelude))
    body = "\n".join(lines)
    first, _, rest = body.partition("\n")
    at_label = bool(_LABEL.match(first))
    entry = "\n".join(prelude) + "\n"
    body = first + "\n" + entry + rest if at_label else entry + body
    return (head + body + "}\n").replace(_LOCAL, "\x00")  # marked: the caller checks for uses outside functions


def _expand(line: str, made: dict[str, str], prelude: list[str]) -> str:
    """`line` with each constant expression around a variable's pointer replaced by the value
    of an instruction appended to `prelude` (the entry block: the pointer is known there)."""
    while True:
        for m in re.finditer(re.escape(_LOCAL) + r"[\w.]+", line):
            open_ = _enclosing_paren(line, m.start())
            if open_ >= 0 and (op := _OPENER.search(line, 0, open_)) is not None:
                break
        else:
            return line
        close = _closing_paren(line, open_)
        instruction = f"{line[op.start():open_].rstrip()} {line[open_ + 1:close]}"
        name = made.get(instruction)
        if name is None:
            name = made[instruction] = f"{_LOCAL}e{len(made)}"
            prelude.append(f"  {name} = {instruction}")
        line = line[: op.start()] + name + line[close + 1:]


def _enclosing_paren(line: str, pos: int) -> int:
    depth = 0
    for i in range(pos - 1, -1, -1):
        if line[i] == ")":
            depth += 1
        elif line[i] == "(":
            if depth == 0:
                return i
            depth -= 1
    return -1


def _closing_paren(line: str, open_: int) -> int:
    depth = 0
    for i in range(open_, len(line)):
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SpecializeError(f"internal: unbalanced parentheses in {line.strip()[:120]}")


def _line_at(text: str, pos: int) -> str:
    return text[text.rfind("\n", 0, pos) + 1 : text.find("\n", pos)]


def patch_image(image: codegen.Image, addresses: dict[str, int]) -> codegen.Image:
    """`image` with each device variable's pointer set to its address (`addresses`: name ->
    address, the names numbered in sorted order as load_through_pointers numbered them)."""
    if not addresses:
        return image
    values = {pointer_name(i): addresses[n] for i, n in enumerate(sorted(addresses))}
    if isinstance(image, codegen.PTX):  # the driver compiles it: the initializer is text
        text = image.text
        for name, addr in values.items():
            text = re.sub(r"(\.global \.align 8 \.u64 " + re.escape(name) + r" = )(?:0x[0-9a-fA-F]+|\d+);", rf"\g<1>{addr:#x};", text)
        return codegen.PTX(text, image.arch)
    data = elf64.patch_symbols(image.data, {name: addr.to_bytes(8, "little") for name, addr in values.items()})
    return type(image)(data, image.arch)
