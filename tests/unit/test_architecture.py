"""docs/dev/architecture.md against the tree, so that the page stays true where a test can tell.

- Every module of proteus_rewrite/ is named, in backticks, by its path under proteus_rewrite/
  (`runtime/flow.py`, `cache.py`) or from the repository's top (`proteus_rewrite/__init__.py`).
  An __init__.py or __main__.py that defines no function or class is exempt: it only
  re-exports or calls what another module defines (inject/__init__.py is a docstring,
  runtime/__init__.py re-exports entry.py, each __main__.py calls one function), so it has
  nothing of its own a reader needs to find. One that defines something (the top package's
  import_path, cli/__init__.py's run, fatbin/ and jit/'s lazy __getattr__) is checked like any
  module.
- Every C file and header directly in shim/ (not shim/nvtx3/, the NVTX headers kept verbatim) is
  named, in backticks, as `name.c` or `shim/name.c`.
- Every call of runtime/protocol.py's CALLS has a row in the boundary's table (the table whose
  first column is headed "call"): `name` in the first cell and its exact `format` in the
  second, and the table has no row for a call that is gone. In the row's shim-side cell, every
  backticked function is defined where it says: py_* and python_ready in shim/python.c, the
  others in the last `file.c` named before them; in the run-time-side cell, every `module.name`
  (`flow.specialize`, `session.Session.open`) is defined in proteus_rewrite/runtime/module.py.
- In the section "Following one scalar argument", every row of the table whose first column is
  headed "step" names one file in its second cell (`shim/jobs.c`, `proteus_rewrite/jit/ir.py`)
  and, in its third, functions defined in that file (`Class.method` for a method); and the
  section's "runs through **N files**" counts the distinct files of those rows.
- The shim's core files (every `.c` in shim/ but the platforms' `cuda*.c` and `hip.c`) call each
  other in one direction only: files in a call loop can be neither read nor layered apart.
  This reads the tree, not the page. tests/shim/test_layers.py checks the page's layers, and
  lets two files of one layer (`jobs.c`, `lifecycle.c`) use each other, so a loop between them
  would pass there.

The checks take the page's text, so they can be run against another version of it:
    python -c "from tests.unit import test_architecture as t; print(t.problems(open(PATH).read()))"
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from proteus_rewrite.runtime import protocol

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/dev/architecture.md"
PACKAGE = ROOT / "proteus_rewrite"
SHIM = ROOT / "shim"
BOUNDARY = "The C↔Python boundary"
SCALAR = "Following one scalar argument"


# ---------------------------------------------------------------- reading the page


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", text))


def section(text: str, title: str) -> str:
    """The text under the level-2 heading `title`, up to the next level-2 heading ("" if none)."""
    m = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def table(text: str, first_header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first Markdown table whose first header cell is
    `first_header`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and _cells(line)[:1] == [first_header]:
            rows = []
            for row in lines[i + 1:]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
            return rows
    return []


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


# ---------------------------------------------------------------- reading the tree


def required_modules() -> list[str]:
    """Every module of the package, as its path under proteus_rewrite/, less the exempt ones."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        if path.name in ("__init__.py", "__main__.py") and not _defines_anything(path):
            continue
        out.append(path.relative_to(PACKAGE).as_posix())
    return out


def _defines_anything(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def shim_files() -> list[str]:
    return sorted(p.name for p in SHIM.iterdir() if p.is_file() and p.suffix in (".c", ".h"))


@functools.lru_cache(maxsize=None)
def _c_code(path: Path) -> str:
    """A C file with its comments blanked (a comment may show a call that looks like a definition)."""
    src = path.read_text()
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)


def c_defines(path: Path, name: str) -> bool:
    """Whether the C file defines function `name`: on its line, only a type before it (words and
    `*`, attributes aside), then a parameter list and a body. A call has `(`, `=`, `,`, `return`
    or nothing before it, or `;` after its arguments."""
    code = _c_code(path)
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", code):
        line = code[code.rfind("\n", 0, m.start()) + 1:m.start()]
        words = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", line)
        if not re.fullmatch(r"[ \t]*(?:\w+[ \t*]+)+", words) or set(words.split()) & {"return", "else", "if", "case"}:
            continue
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            if depth == 0:
                break
            i += 1
        if code[i + 1:].lstrip().startswith("{"):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _py_names(path: Path) -> frozenset[str]:
    """The module's top-level functions and classes, and Class.method for their methods."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(names)


def defines(path: Path, name: str) -> bool:
    if not path.is_file():
        return False
    return name in _py_names(path) if path.suffix == ".py" else c_defines(path, name)


# A top-level function definition in comment-blanked C: at the start of a line, words and `*`
# (the type; attributes taken out first), the name, a parameter list (one level of nested
# parentheses, as in a function pointer parameter) and a body.
_C_DEFINITION = re.compile(r"^((?:[A-Za-z_]\w*[ \t*]+)+)([A-Za-z_]\w*)\s*\((?:[^;{}()]|\([^()]*\))*\)\s*\{", re.M)
_C_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)\)\s*")
_C_LITERAL = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"")


def core_sources() -> dict[str, str]:
    """The shim's core .c files (all but the platforms') by name, with comments and literals blanked."""
    return {p.name: _C_LITERAL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), _c_code(p))
            for p in sorted(SHIM.glob("*.c")) if not p.name.startswith(("cuda", "hip"))}


def call_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """file -> the other files whose functions it calls: a call is `name(` anywhere in its code,
    of a function it does not define itself and another file defines without `static`."""
    owner: dict[str, str] = {}
    own: dict[str, set[str]] = {}
    for name, code in sources.items():
        for m in _C_DEFINITION.finditer(_C_ATTRIBUTE.sub("", code)):
            own.setdefault(name, set()).add(m.group(2))
            if "static" not in m.group(1).split():
                owner[m.group(2)] = name
    return {name: {owner[f] for f in re.findall(r"\b([A-Za-z_]\w*)\s*\(", code) if f in owner and f not in own.get(name, ())}
            for name, code in sources.items()}


def call_loop(graph: dict[str, set[str]]) -> list[str]:
    """One loop of the graph as the files along it, the first repeated at the end; [] if none."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        path, state[node] = path + [node], 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (loop := visit(nxt, path)):
                return loop
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (loop := visit(node, [])):
            return loop
    return []


# ---------------------------------------------------------------- the checks


def missing_modules(text: str) -> list[str]:
    named = backticked(text)
    return [m for m in required_modules() if m not in named and f"proteus_rewrite/{m}" not in named]


def missing_shim_files(text: str) -> list[str]:
    named = backticked(text)
    return [f for f in shim_files() if f not in named and f"shim/{f}" not in named]


def call_problems(text: str) -> list[str]:
    rows = table(section(text, BOUNDARY), "call")
    listed: dict[str, str] = {}
    problems = []
    for cells in rows:
        name = re.fullmatch(r"`(\w+)`", cells[0])
        if name is None:
            problems.append(f"boundary table: a row without a `call` name: {cells[0]!r}")
            continue
        listed[name.group(1)] = cells[1] if len(cells) > 1 else ""
        if len(cells) > 3:
            problems += _shim_side_problems(name.group(1), cells[3])
        if len(cells) > 4:
            problems += _runtime_side_problems(name.group(1), cells[4])
    for call in protocol.CALLS:
        want = f"`{call.format}`" if call.format else "none"
        if call.name not in listed:
            problems.append(f"boundary table: no row for {call.name} ({want})")
        elif listed[call.name] != want:
            problems.append(f"boundary table: {call.name}'s format is {want}, the row says {listed[call.name]!r}")
    gone = sorted(set(listed) - {c.name for c in protocol.CALLS})
    problems += [f"boundary table: {name} is not a call of runtime/protocol.py" for name in gone]
    return problems


def _shim_side_problems(call: str, cell: str) -> list[str]:
    problems, current = [], SHIM / "python.c"
    for token in re.findall(r"`([^`]+)`", cell):
        if re.fullmatch(r"\w+\.[ch]", token):
            current = SHIM / token
        elif re.fullmatch(r"\w+", token):
            where = SHIM / "python.c" if token.startswith("py_") or token == "python_ready" else current
            if not defines(where, token):
                problems.append(f"boundary table, {call}: {token} is not defined in shim/{where.name}")
    return problems


def _runtime_side_problems(call: str, cell: str) -> list[str]:
    problems = []
    for token in re.findall(r"`([^`]+)`", cell):
        module, _, name = token.partition(".")
        if not name or not re.fullmatch(r"\w+(\.\w+)?", name):
            continue  # (entry.py itself, or prose)
        if not defines(PACKAGE / "runtime" / f"{module}.py", name):
            problems.append(f"boundary table, {call}: {name} is not defined in proteus_rewrite/runtime/{module}.py")
    return problems


def scalar_steps(text: str) -> list[tuple[str, list[str]]]:
    """(file, functions) of each row of the scalar's table."""
    steps = []
    for cells in table(section(text, SCALAR), "step"):
        files = re.findall(r"`([^`]+)`", cells[1]) if len(cells) > 1 else []
        functions = re.findall(r"`([^`]+)`", cells[2]) if len(cells) > 2 else []
        steps.append((files[0] if len(files) == 1 else "", functions))
    return steps


def scalar_problems(text: str) -> list[str]:
    steps = scalar_steps(text)
    if not steps:
        return [f'no "## {SCALAR}" section with a table headed "step"']
    problems = []
    for i, (file, functions) in enumerate(steps, 1):
        if not file:
            problems.append(f"scalar path, row {i}: its second cell names no single `file`")
        elif not (ROOT / file).is_file():
            problems.append(f"scalar path, row {i}: {file} does not exist")
        elif not functions:
            problems.append(f"scalar path, row {i}: no `function` named beside {file}")
        problems += [f"scalar path, row {i}: {f} is not defined in {file}" for f in functions
                     if file and (ROOT / file).is_file() and not defines(ROOT / file, f)]
    files = {f for f, _ in steps if f}
    stated = re.search(r"runs through \*\*(\d+) files\*\*", section(text, SCALAR))
    if stated is None:
        problems.append("scalar path: the section does not say how many files it runs through (**N files**)")
    elif int(stated.group(1)) != len(files):
        problems.append(f"scalar path: it says {stated.group(1)} files, its table names {len(files)}")
    return problems


def problems(text: str) -> list[str]:
    """Everything the tests below find wrong with a version of the page."""
    return ([f"module not named: {m}" for m in missing_modules(text)]
            + [f"shim file not named: {f}" for f in missing_shim_files(text)]
            + call_problems(text) + scalar_problems(text))


# ---------------------------------------------------------------- the tests


def test_every_module_is_named():
    assert not missing_modules(DOC.read_text())


def test_every_shim_file_is_named():
    assert not missing_shim_files(DOC.read_text())


def test_every_protocol_call_is_in_the_boundary_table():
    assert not call_problems(DOC.read_text())


def test_the_scalar_path_names_real_functions():
    assert not scalar_problems(DOC.read_text())


def test_the_checks_see_what_goes_missing():
    text = DOC.read_text()
    assert scalar_steps(text) and required_modules() and shim_files()  # the checks read something
    assert "module not named: runtime/flow.py" in problems(text.replace("runtime/flow.py", "runtime/flows.py"))
    assert "shim file not named: trial.c" in problems(text.replace("`trial.c`", "trial.c"))
    dropped = "\n".join(line for line in text.splitlines() if not line.startswith("| `warm_set` |"))
    assert "boundary table: no row for warm_set (`y#`)" in call_problems(dropped)
    assert any("init's format" in p for p in call_problems(text.replace("| `init` | `si` |", "| `init` | `is` |")))
    renamed = text.replace("| `pick_miss`, `miss_variant`", "| `pick_miss`, `miss_variants`")
    assert "scalar path, row 5: miss_variants is not defined in shim/jobs.c" in scalar_problems(renamed)


def test_the_shim_core_calls_in_one_direction():
    loop = call_loop(call_graph(core_sources()))
    assert not loop, f"shim files call each other in a loop: {' -> '.join(loop)} (move what both need into the lower file)"


def test_the_call_graph_sees_calls_and_loops():
    graph = call_graph(core_sources())
    assert "jobs.c" in graph["lifecycle.c"] and "python.c" in graph["jobs.c"]   # stop_workers; py_miss
    assert "lifecycle.c" not in graph["tables.c"]
    sources = {"a.c": "static int g(void) { return 0; }\nint f(int x) {\n  return h(x);\n}\n",
               "b.c": "__attribute__((noinline)) int h(int x) { return x ? f(x - 1) : g(); }\n",
               "c.c": "void k(void (*cb)(void),\n       int n) { h(n); }\nint g(void) { return 1; }\n"}
    assert call_graph(sources) == {"a.c": {"b.c"}, "b.c": {"a.c", "c.c"}, "c.c": {"b.c"}}
    assert call_loop(call_graph(sources))[0] == call_loop(call_graph(sources))[-1]
    assert call_loop({"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": set()}) == []
