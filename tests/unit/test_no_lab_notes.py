"""Product code and user docs state what holds and why; the evidence (which GPU, which day, which
commit, which results file) lives in docs/dev/findings/. A comment that says "on the H100 at
1a2b3c4 (bench/results/x.json)" goes stale when the file is replaced or the host changes, so
these are kept out of the product: comments and docstrings of proteus_rewrite/ and shim/, and
the whole of README.md and docs/user/.

Checked: a GPU model (H100, A100, MI250, ...), a date (YYYY-MM-DD), a path into bench/results,
and, in prose only, a word of 7 to 12 hex digits with at least one digit and one letter (a
commit). In Python, hosts, dates and paths are checked in every string too (help text is
product); hex words only in comments and docstrings, where they cannot be constants. In
Markdown, hex words inside code (fenced or `inline`) are examples of keys and symbols, not
commits."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GPU = re.compile(
    r"\b(?:[ABHV]100|H[28]00|A[48]00|A[1-4]0G?|L40S?|[BG]B200|GH200|B[12]00|T4|RTX ?\d{4}"
    r"|MI\d{2,3}[AXH]?)\b"
)
DATE = re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")
RESULTS = re.compile(r"bench/results\b")
# A word (letters, digits, _ and $ together) that is nothing but 7-12 lower-case hex digits,
# at least one of them a digit and one a letter: `$proteus$3f9c...`, `0x3F73...` and `1048576`
# are not such words.
WORD = re.compile(r"[\w$]+")
COMMIT = re.compile(r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}")
EXPONENT = re.compile(r"\d+e\d*")  # "3.140000e+00" splits into "3", "140000e", "00"


def commits(text: str) -> list[str]:
    return [w for w in WORD.findall(text) if COMMIT.fullmatch(w) and not EXPONENT.fullmatch(w)]


def lab_notes(text: str, hex_words: bool) -> list[str]:
    found = [m.group() for rx in (GPU, DATE, RESULTS) for m in rx.finditer(text)]
    return found + (commits(text) if hex_words else [])


def python_texts(src: str) -> list[tuple[int, str, bool]]:
    """(line, text, prose) for each comment and string of a Python file; prose: a comment or a
    docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    docstrings.add(body[0].lineno)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string, True))
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append((tok.start[0], tok.string, tok.start[0] in docstrings))
    return out


def c_comments(src: str) -> list[tuple[int, str, bool]]:
    """(line, text, True) for each comment of a C file; string and character literals skipped."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            end = src.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append((src.count("\n", 0, i) + 1, src[i:end], True))
            i = end
        elif src.startswith("//", i):
            end = src.find("\n", i)
            end = n if end < 0 else end
            out.append((src.count("\n", 0, i) + 1, src[i:end], True))
            i = end
        elif c in "\"'":
            i += 1
            while i < n and src[i] != c and src[i] != "\n":
                i += 2 if src[i] == "\\" else 1
            i += 1
        else:
            i += 1
    return out


def markdown_texts(src: str) -> list[tuple[int, str, bool]]:
    """(line, text, prose) for each line of a Markdown page, its inline code split off as not
    prose, and fenced blocks not prose."""
    out, fenced = [], False
    for no, line in enumerate(src.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append((no, line, False))
            continue
        parts = line.split("`")
        out += [(no, part, k % 2 == 0) for k, part in enumerate(parts)]
    return out


def product_files() -> list[Path]:
    code = sorted(ROOT.glob("proteus_rewrite/**/*.py"))
    shim = sorted(p for p in [*ROOT.glob("shim/*.c"), *ROOT.glob("shim/*.h")])
    docs = [ROOT / "README.md", *sorted(ROOT.glob("docs/user/*.md"))]
    return [*code, *shim, *docs]


def texts(path: Path) -> list[tuple[int, str, bool]]:
    src = path.read_text(errors="replace")
    if path.suffix == ".py":
        return python_texts(src)
    if path.suffix in (".c", ".h"):
        return c_comments(src)
    return markdown_texts(src)


def test_the_checks_catch_lab_notes_and_spare_constants():
    assert lab_notes("# 1.09x on the H100 at 7d506dc (bench/results/x.md)", True) == [
        "H100", "bench/results", "7d506dc"]
    assert lab_notes("measured 2026-11-25 on an MI250X", True) == ["MI250X", "2026-11-25"]
    assert not lab_notes("0x3F7323551A8FB86E 1048576 `$proteus$3f9c0e1d2a4b` deadbeef", True)
    assert not lab_notes("2.759982 natively, sm_90, gfx90a, cafe, ffffffff, 3.140000e+00", True)
    assert python_texts('"""Doc 1a2b3c4."""\nX = "abc1234"  # c 5e6f708\n') == [
        (1, '"""Doc 1a2b3c4."""', True), (2, '"abc1234"', False), (2, "# c 5e6f708", True)]
    assert c_comments('s = "/* no */"; /* yes */ c = \'"\'; // too\n') == [
        (1, "/* yes */", True), (1, "// too", True)]


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lab_notes(path):
    found = [f"{path.relative_to(ROOT)}:{line}: {note}"
             for line, text, prose in texts(path) for note in lab_notes(text, prose)]
    assert not found, "hosts, dates, commits and results files belong in docs/dev/findings/:\n" + \
        "\n".join(found)
