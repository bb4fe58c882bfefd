"""What build.py and run.py share: the program list (programs.json), output masking, the
comparison of two outputs, and the share of launches a PROTEUS_REPORT says were specialized.

Standard library only: run.py and this file travel in the packed tarball to a GPU host that
may have nothing but Python and the tool.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS_JSON = HERE / "programs.json"
SUITES = ("paper", "corpus")
RECIPES = ("plain", "recommended", "exact-fp", "fembed-bitcode", "shared-lib", "nvcc")
# shared-lib: the exact-fp recipe with every object of the program (main included) in a shared
# library, lib<name>.so, and `main` a launcher with no code of its own, whose main the library
# defines: the layout of applications that keep their kernels in libraries.
SHARED_LIB = "shared-lib"
# nvcc: built by nvcc with the program's own Makefile flags (programs.json: nvcc_flags, nvcc_libs,
# nvcc_rdc), -arch=sm_90: SASS beside compute_90 PTX, the tool's PTX route.
NVCC = "nvcc"
MASKED = "<masked>"
# The corpus is drawn from names a..m; n..z stay untouched as an independent check.
CORPUS_FIRST_LETTERS = "abcdefghijklm"


def load_programs(path: Path = PROGRAMS_JSON) -> dict:
    return json.loads(Path(path).read_text())


def program_recipes(program: dict) -> tuple[str, ...]:
    """The recipes a program is built in: its `recipes` list (nvcc-only programs, which clang
    cannot build), else every recipe; nvcc only where programs.json has its Makefile's flags."""
    recipes = tuple(program.get("recipes", RECIPES))
    return recipes if "nvcc_flags" in program else tuple(r for r in recipes if r != NVCC)


def select(doc: dict, suite: str = "all", names: list[str] | None = None) -> list[dict]:
    """Programs of `suite` ("paper", "corpus" or "all"), restricted to `names` when given
    (in programs.json's order); an unknown name is an error rather than silently nothing."""
    progs = [p for p in doc["programs"] if suite == "all" or p["suite"] == suite]
    if names:
        known = {p["name"] for p in doc["programs"]}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown program(s): {', '.join(unknown)}")
        progs = [p for p in progs if p["name"] in names]
    return progs


def validate(doc: dict) -> list[str]:
    """Problems with programs.json, as sentences (empty: well-formed). The tests call this."""
    problems: list[str] = []
    seen: set[str] = set()
    required = {"name": str, "suite": str, "folder": str, "sources": list, "flags": list, "args": list,
                "inputs": list, "mask": list, "tags": list}
    for p in doc.get("programs", []):
        name = p.get("name", "?")
        for key, typ in required.items():
            if not isinstance(p.get(key), typ):
                problems.append(f"{name}: {key} missing or not a {typ.__name__}")
        if name in seen:
            problems.append(f"{name}: listed twice")
        seen.add(name)
        if p.get("suite") not in SUITES:
            problems.append(f"{name}: suite {p.get('suite')!r} is not one of {SUITES}")
        if p.get("folder") != f"src/{name}-cuda":
            problems.append(f"{name}: folder {p.get('folder')!r} is not src/{name}-cuda")
        if p.get("suite") == "corpus" and name[:1].lower() not in CORPUS_FIRST_LETTERS:
            problems.append(f"{name}: corpus programs start with a..m")
        for rx in [*p.get("mask", []), *p.get("strip", [])]:
            try:
                re.compile(rx)
            except re.error as exc:
                problems.append(f"{name}: mask {rx!r}: {exc}")
        if not all(isinstance(a, str) for a in p.get("args", [])):
            problems.append(f"{name}: args must be strings")
        problems += _nvcc_problems(p)
    for name in set(doc.get("excluded", {})) & seen:
        problems.append(f"{name}: both listed and excluded")
    return problems


def _nvcc_problems(p: dict) -> list[str]:
    name, problems = p.get("name", "?"), []
    recipes = p.get("recipes", RECIPES)
    if not isinstance(recipes, list if "recipes" in p else tuple) or not set(recipes) <= set(RECIPES) or not recipes:
        problems.append(f"{name}: recipes {recipes!r} are not a list from {RECIPES}")
    flags = p.get("nvcc_flags")
    if flags is None:
        if NVCC in p.get("recipes", ()):
            problems.append(f"{name}: recipes name nvcc but nvcc_flags is missing")
        return problems
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        problems.append(f"{name}: nvcc_flags must be a list of strings")
    elif "-arch=sm_90" not in flags:
        problems.append(f"{name}: nvcc_flags lack -arch=sm_90 (SASS and compute_90 PTX)")
    if not isinstance(p.get("nvcc_libs", []), list):
        problems.append(f"{name}: nvcc_libs must be a list")
    if not isinstance(p.get("nvcc_rdc", False), bool):
        problems.append(f"{name}: nvcc_rdc must be true or false")
    if p.get("nvcc_rdc") and "rdc" not in p.get("tags", []):
        problems.append(f"{name}: nvcc_rdc programs are tagged rdc")
    return problems


def mask_patterns(doc: dict, program: dict) -> list[re.Pattern]:
    return [re.compile(rx) for rx in [*doc.get("default_mask", []), *program.get("mask", [])]]


_VERDICT_WORDS = re.compile(r"\b(PASS(?:ED)?|FAIL(?:ED|URE)?|[Ee]rror|ERROR)\b")


def strip_patterns(program: dict) -> list[re.Pattern]:
    return [re.compile(rx) for rx in program.get("strip", [])]


def mask_lines(text: str, patterns: list[re.Pattern], strip: list[re.Pattern] = ()) -> list[str]:
    """The output's lines with every line a pattern matches replaced by MASKED: timings and
    addresses change from run to run, the rest must not. A masked line keeps its PASS/FAIL
    words ("PASS  Average time: 3.1 ms" is one line in some programs). `strip` patterns are
    cut out of every line first (a clock reading in front of each result line, say).
    Trailing blanks are not output."""
    lines = []
    for line in text.splitlines():
        for p in strip:
            line = p.sub("", line)
        lines.append(_mask(line) if any(p.search(line) for p in patterns) else line.rstrip())
    return lines


def _mask(line: str) -> str:
    return " ".join([MASKED, *_VERDICT_WORDS.findall(line)])


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)", re.IGNORECASE)


def _numbers_close(a: str, b: str, rtol: float) -> tuple[bool, float]:
    """Whether two lines differ only in numbers within rtol (relative), and by how much."""
    if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        return False, math.inf
    worst = 0.0
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        fx, fy = float(x), float(y)
        if fx == fy or (math.isnan(fx) and math.isnan(fy)):
            continue
        rel = abs(fx - fy) / max(abs(fx), abs(fy))
        worst = max(worst, rel)
    return worst <= rtol, worst


def unstable_lines(first: list[str], second: list[str]) -> set[int]:
    """Line numbers where two native runs of one binary disagree (atomics in a different order,
    a random seed from the clock): the tool cannot be asked to agree there either. Runs of
    different lengths give no positions; the comparison then reports the native runs unstable."""
    if len(first) != len(second):
        return set()
    return {i for i, (a, b) in enumerate(zip(first, second)) if a != b}


@dataclass
class Comparison:
    verdict: str  # same | close | unstable | differs
    max_rel: float = 0.0
    diff: list[str] = field(default_factory=list)  # the first differing lines, "-native" / "+tool"


def compare(native: list[str], tool: list[str], rtol: float = 0.0, unstable: set[int] | None = None,
            native_unstable: bool = False, keep: int = 12) -> Comparison:
    """Compare masked outputs. `unstable` line numbers are ignored (they differ natively too);
    numbers within `rtol` give "close" rather than "differs"; when the native runs themselves
    disagreed in ways positions cannot express, a difference is "unstable", not the tool's fault."""
    unstable = unstable or set()
    diff: list[str] = []
    worst = 0.0
    close_only = True
    for i in range(max(len(native), len(tool))):
        a = native[i] if i < len(native) else None
        b = tool[i] if i < len(tool) else None
        if a == b or i in unstable:
            continue
        if a is not None and b is not None:
            ok, rel = _numbers_close(a, b, rtol)
            if ok:
                worst = max(worst, rel)
                continue
        close_only = False
        if len(diff) < keep:
            diff += [f"{i + 1}-{a!r}", f"{i + 1}+{b!r}"]
    if close_only:
        return Comparison("same" if worst == 0.0 else "close", worst)
    return Comparison("unstable" if native_unstable else "differs", worst, diff)
