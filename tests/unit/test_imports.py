"""No import cycles among proteus_rewrite's modules.

A cycle makes which module finishes loading first depend on which one a caller happens to
import first, and hides a missing split: two modules that need each other are one module, or
share a third. Every import counts, including those inside functions (a deferred import only
moves the cycle to the first call).

An edge goes to the module an import names: `from . import protocol` to the submodule
`protocol`, `from .miss import track` to `miss`, `from .. import __version__` to the package
itself. Importing a submodule also runs its parents' `__init__`, but that is not counted as an
edge: a package's `__init__` that re-exports its submodules would otherwise close a cycle with
each of them, and Python finishes those (the parent is already in sys.modules, partly set up).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "proteus_rewrite"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package: its dotted name -> its file (a package is its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` (at `path`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_nearest(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                found.add(_nearest(f"{origin}.{alias.name}", known) if f"{origin}.{alias.name}" in known
                          else _nearest(origin, known))
    found.discard(None)
    found.discard(name)
    return found


def _nearest(dotted: str, known: set[str]) -> str | None:
    """The package's module a dotted name lands in (None: outside the package)."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    mods = modules(root, package)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, with
    one cycle through it spelled out first for the message."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _path_through(comp: list[str], edges: dict[str, set[str]]) -> str:
    """One cycle inside a component, as `a -> b -> a`."""
    members, start = set(comp), comp[0]
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return " -> ".join([*reversed(path), start])
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return " <-> ".join(comp)


def test_the_package_has_no_import_cycle():
    edges = graph()
    assert len(edges) > 50, "the walk found too few modules: is ROOT right?"
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(_path_through(c, edges) for c in found)


def test_the_checker_sees_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from . import b\n\ndef f():\n    return b\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    (pkg / "c.py").write_text("from .sub import a\nimport os\n")
    edges = graph(pkg, "pkg")
    assert edges["pkg.sub.b"] == {"pkg.sub.a"} and edges["pkg.c"] == {"pkg.sub.a"}
    assert cycles(edges) == [["pkg.sub.a", "pkg.sub.b"]]
    assert _path_through(["pkg.sub.a", "pkg.sub.b"], edges) == "pkg.sub.a -> pkg.sub.b -> pkg.sub.a"
