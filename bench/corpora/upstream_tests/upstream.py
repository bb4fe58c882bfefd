"""What build.py reads from upstream Proteus (Olympus-HPC/proteus, tests/gpu) into programs.json:
the bare git mirror, the executables tests/gpu's CMakeLists builds for CUDA with their sources
and libraries, and each one's lit RUN lines (environment, FileCheck prefixes) and CHECK lines,
or why it is left out; and what makes programs.json well-formed (validate).

build.py --update-programs writes programs.json from this; builds and --pack read it back
(load_programs). Nothing here runs on the GPU host: run.py reads programs.json alone.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Callable

HERE = Path(__file__).resolve().parent
PROGRAMS_JSON = HERE / "programs.json"
DEFAULT_MIRROR = "/work/.mirror/Olympus-HPC+proteus/repo"
UPSTREAM_REPO = "https://github.com/Olympus-HPC/proteus"
TESTS_DIR = "tests/gpu"

# Why a program cannot be built or compared without the plugin, by what its sources use.
# The first rule that matches gives the one-line reason in programs.json.
EXCLUSION_RULES = (
    (re.compile(r"proteus::(jit_variable|register_lambda)\b"),
     "lambda JIT: proteus::jit_variable/register_lambda hand captured values to the plugin's "
     "lambda specialization, which has no counterpart without the plugin"),
    (re.compile(r"proteus::jit_(arg|array|object)\s*\("),
     "proteus::jit_arg/jit_array/jit_object in kernel code: declared, never defined; the plugin "
     "removes these calls, without it the device code does not link (a stand-in would change kernel code)"),
    (re.compile(r"proteus::runtime::captureKernelMetadata"),
     "reads the plugin's per-kernel metadata (proteus::runtime::captureKernelMetadata); "
     "without the plugin there is none and the program aborts by design"),
)

# What a reader of the results should know about a program that is built.
NOTES = {
    "kernel_host_jit": "host-side annotate(\"jit\") on launcher(): inert without the plugin, the launcher runs as compiled",
    "kernel_host_device_jit": "host-side annotate(\"jit\") on launcher(): inert without the plugin; the device kernel is annotated",
    "force_annotations": "built without the plugin's -force-proteus-jit-annotate-all: its kernels carry no annotation",
    "enable_disable": "proteus::enable/disable are do-nothing link stubs (stubs/proteus_host_stubs.cpp)",
    "kernel_pass_plugin": "proteus::registerJITPassPlugin is a do-nothing link stub; the JIT pass plugin it names is not built",
    "kernels_gvar": "prints device addresses: masked for the comparison with the native run ([[ADDR]] checks still apply)",
    "gvar_tracking": "upstream notes it printed 'Kernel 1 value is 0' on one system",
    "kernel_tuning": "upstream's RUN line reads tests/gpu/tuned_config.json (PROTEUS_TUNED_KERNELS)",
}
# Output that differs between runs for reasons of no concern to the comparison (regexes).
MASKS = {"kernels_gvar": [r"(?<=addr )(0x)?[0-9a-f]+"]}
# Per-program compile flags upstream's CMakeLists sets with target_compile_definitions.
EXTRA_FLAGS = {"kernel_pass_plugin": ['-DPROTEUS_TEST_JIT_PASS_PLUGIN_PATH="not-built"']}


# --- the mirror ------------------------------------------------------------------------------

class Mirror:
    def __init__(self, path: str | Path, commit: str = "HEAD"):
        self.path = Path(path)
        self.commit = self._git("rev-parse", commit).strip()

    def _git(self, *args: str) -> str:
        proc = subprocess.run(["git", f"--git-dir={self.path}", *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"git {' '.join(args)} in {self.path}: {proc.stderr.strip()}")
        return proc.stdout

    def read(self, path: str) -> str:
        return self._git("show", f"{self.commit}:{path}")

    def files(self, under: str) -> list[str]:
        return self._git("ls-tree", "-r", "--name-only", self.commit, under).split()

    def extract(self, dest: Path, *paths: str) -> None:
        """git archive of `paths` at the commit into dest, replacing what a previous commit left."""
        stamp = dest / ".upstream-commit"
        if stamp.exists() and stamp.read_text().strip() == self.commit:
            return
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", f"--git-dir={self.path}", "archive", self.commit, *paths],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        (tmp / ".upstream-commit").write_text(self.commit + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.replace(dest)


# --- upstream's CMakeLists ---------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def cmake_commands(text: str) -> list[tuple[str, list[str]]]:
    """CMake's command invocations, (lower-case name, arguments): enough of the language for
    tests/gpu (quoted arguments span lines and hold parentheses, as in its file(WRITE ...))."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "#":
            i = _line_end(text, i)
            continue
        m = _IDENT.match(text, i)
        if not m:
            i += 1
            continue
        j = m.end()
        while j < n and text[j] in " \t":
            j += 1
        if j < n and text[j] == "(":
            args, i = _cmake_args(text, j + 1)
            out.append((m.group().lower(), args))
        else:
            i = j
    return out


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def _cmake_args(text: str, i: int) -> tuple[list[str], int]:
    args: list[str] = []
    cur: list[str] = []
    depth = 0
    while i < len(text):
        c = text[i]
        if c == '"' and not cur:
            j, quoted = i + 1, []
            while text[j] != '"':
                step = 2 if text[j] == "\\" else 1
                quoted.append(text[j:j + step])
                j += step
            args.append("".join(quoted))
            i = j + 1
            continue
        if c == "#":
            i = _line_end(text, i)
            continue
        if c.isspace() or (c == ")" and depth == 0):
            if cur:
                args.append("".join(cur))
                cur = []
            if c == ")":
                return args, i + 1
            i += 1
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        cur.append(c)
        i += 1
    raise ValueError("unbalanced parentheses in CMakeLists.txt")


_VERSION_OPS = {"VERSION_LESS": "<", "VERSION_GREATER": ">", "VERSION_EQUAL": "==",
                "VERSION_LESS_EQUAL": "<=", "VERSION_GREATER_EQUAL": ">="}
_NUMBER_OPS = {"LESS": "<", "GREATER": ">", "EQUAL": "==", "LESS_EQUAL": "<=", "GREATER_EQUAL": ">="}


def cmake_condition(args: list[str], variables: dict[str, object]) -> bool:
    """if()'s condition, for the forms upstream uses: VAR, NOT, AND, OR, comparisons. An unknown
    variable is an error: a new condition upstream must be looked at, not guessed."""
    def value(tok: str) -> str:
        return str(variables[tok]) if tok in variables else tok

    def term(toks: list[str]) -> bool:
        if toks and toks[0] == "NOT":
            return not term(toks[1:])
        if len(toks) == 3:
            a, op, b = value(toks[0]), toks[1], value(toks[2])
            if op == "STREQUAL":
                return a == b
            if op in _VERSION_OPS:
                va, vb = (tuple(int(x) for x in v.split(".")) for v in (a, b))
                return _compare(va, _VERSION_OPS[op], vb)
            if op in _NUMBER_OPS:
                return _compare(float(a), _NUMBER_OPS[op], float(b))
        if len(toks) == 1:
            tok = toks[0]
            if tok in variables:
                v = variables[tok]
                return bool(v) and str(v).upper() not in ("0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND")
            if tok.upper() in ("1", "ON", "YES", "TRUE", "Y"):
                return True
            if tok.upper() in ("0", "OFF", "NO", "FALSE", "N", ""):
                return False
        raise ValueError(f"CMake condition not understood: {' '.join(args)}")

    def split(toks: list[str], word: str) -> list[list[str]]:
        parts: list[list[str]] = [[]]
        for t in toks:
            if t == word:
                parts.append([])
            else:
                parts[-1].append(t)
        return parts

    return any(all(term(t) for t in split(part, "AND")) for part in split(args, "OR"))


def _compare(a, op: str, b) -> bool:
    return {"<": a < b, ">": a > b, "==": a == b, "<=": a <= b, ">=": a >= b}[op]


def cuda_targets(read: Callable[[str], str], llvm_major: int) -> list[dict]:
    """The executables upstream's tests/gpu CMakeLists builds when PROTEUS_ENABLE_CUDA is on,
    with their sources (relative to tests/gpu) and the libraries they link."""
    variables: dict[str, object] = {"PROTEUS_ENABLE_HIP": False, "PROTEUS_ENABLE_CUDA": True,
                                    "LLVM_VERSION_MAJOR": llvm_major, "lang": "CUDA",
                                    "CMAKE_CUDA_ARCHITECTURES": "90", "CMAKE_CUDA_COMPILER_ID": "Clang"}
    targets: list[dict] = []
    libraries: dict[str, list[str]] = {}

    def expand(arg: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: str(variables.get(m.group(1), m.group(0))), arg)

    def walk(subdir: str) -> None:
        cmds = cmake_commands(read(str(PurePosixPath(TESTS_DIR, subdir, "CMakeLists.txt"))))
        stack: list[list[bool]] = []  # per if(): [enclosing active, a branch taken, this branch active]
        in_function = 0
        for name, raw in cmds:
            args = [expand(a) for a in raw]
            if name in ("function", "macro"):
                in_function += 1
            elif name in ("endfunction", "endmacro"):
                in_function -= 1
            elif in_function:
                continue
            elif name == "if":
                outer = all(s[2] for s in stack)
                taken = outer and cmake_condition(args, variables)
                stack.append([outer, taken, taken])
            elif name == "elseif":
                top = stack[-1]
                top[2] = top[0] and not top[1] and cmake_condition(args, variables)
                top[1] = top[1] or top[2]
            elif name == "else":
                top = stack[-1]
                top[2] = top[0] and not top[1]
                top[1] = True
            elif name == "endif":
                stack.pop()
            elif not all(s[2] for s in stack):
                continue
            elif name == "add_subdirectory":
                walk(str(PurePosixPath(subdir, args[0])))
            elif name in ("create_gpu_library", "create_proteus_gpu_library"):
                libraries[args[0]] = [str(PurePosixPath(subdir, s)) for s in args[1:]]
            elif name.startswith("create_gpu_test"):
                targets.append(_target(name, args, subdir))

    walk("")
    for t in targets:
        t["libraries"] = [{"name": lib, "sources": libraries[lib]} for lib in t.pop("library_names")]
    return targets


def _target(command: str, args: list[str], subdir: str) -> dict:
    kind = command[len("create_gpu_test"):]  # "", _rdc, _libs, _rdc_libs, _force, _rdc_force
    rdc = kind.startswith("_rdc")
    libs = [args.pop(1)] if kind.endswith("_libs") else []
    exe, check, *more = args
    sources = [str(PurePosixPath(subdir, s)) for s in (check, *more)]
    return {"name": exe + (".rdc" if rdc else ""), "base": exe, "source": sources[0], "sources": sources,
            "rdc": rdc, "force_annotations": kind.endswith("_force"), "library_names": libs,
            "cmake": f"{command.upper()}({' '.join([exe, *libs, check, *more])})"}


# --- RUN and CHECK lines ---------------------------------------------------------------------

_RUN = re.compile(r"//\s*RUN:\s?(.*)$")
_CHECK = re.compile(r"//\s*([A-Za-z][A-Za-z0-9_-]*):(.*)$")
_DIRECTIVE = re.compile(r"^(?P<prefix>.+?)(?:-(?P<dir>NEXT|SAME|NOT|DAG|EMPTY|LABEL)|-COUNT-(?P<count>\d+))?$")


def parse_runs(text: str, base: str | None = None) -> list[dict]:
    """The lit RUN lines that run program `base` (any program if None): environment, FileCheck
    prefixes, whether stderr was piped in too, and whether the Proteus cache was fresh (an
    rm -rf came before)."""
    runs, fresh = [], True
    for line in text.splitlines():
        m = _RUN.search(line)
        if not m:
            continue
        cmd = m.group(1).strip()
        if cmd.startswith("rm "):
            fresh = True
            continue
        left, _, right = cmd.partition("|")
        toks = shlex.split(left)
        exe = next((t for t in toks if "%build/" in t), "")
        if not exe:
            continue
        prefixes = []
        for found in re.findall(r"--check-prefix(?:es)?=(\S+)", right):
            prefixes += found.replace("%device_lang", "CUDA").split(",")
        runs.append({"exe": PurePosixPath(exe).name.removesuffix(".%ext"),
                     "env": dict(t.split("=", 1) for t in toks if re.match(r"^\w+=", t)),
                     "check_prefixes": prefixes or ["CHECK"], "stderr_too": "2>&1" in left,
                     "fresh_cache": fresh, "line": cmd})
        fresh = False
    return [r for r in runs if base is None or r["exe"] == base]


def parse_checks(text: str, prefixes: set[str]) -> list[dict]:
    """FileCheck directives of the given prefixes, in file order: prefix, directive (CHECK, NEXT,
    SAME, NOT, DAG, EMPTY, LABEL, COUNT), count, pattern, source line."""
    checks = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _CHECK.search(line)
        if not m or m.group(1) == "RUN":
            continue
        d = _DIRECTIVE.match(m.group(1))
        if d["prefix"] not in prefixes:
            continue
        directive = "COUNT" if d["count"] else (d["dir"] or "CHECK")
        checks.append({"prefix": d["prefix"], "directive": directive, "count": int(d["count"] or 1),
                       "pattern": m.group(2).strip(), "line": number})
    return checks


def describe_programs(mirror: Mirror, llvm_major: int) -> dict:
    """programs.json's content from the mirror: every CUDA target, with its RUN and CHECK lines,
    or why it is left out."""
    targets = cuda_targets(mirror.read, llvm_major)
    texts: dict[str, str] = {}

    def text(rel: str) -> str:
        if rel not in texts:
            texts[rel] = mirror.read(f"{TESTS_DIR}/{rel}")
        return texts[rel]

    programs = []
    for t in targets:
        all_sources = t["sources"] + [s for lib in t["libraries"] for s in lib["sources"]]
        runs = parse_runs(text(t["source"]), t["base"])
        entry = {"name": t["name"], "source": f"{TESTS_DIR}/{t['source']}", "sources": t["sources"],
                 "libraries": t["libraries"], "rdc": t["rdc"], "cmake": t["cmake"], "args": [],
                 "expected_output_source": f"{TESTS_DIR}/{t['source']}", "excluded": None}
        reason = next((why for rx, why in EXCLUSION_RULES if any(rx.search(text(s)) for s in all_sources)), None)
        if reason is None and not runs:
            ran = sorted({r["exe"] for r in parse_runs(text(t["source"]))})
            reason = (f"upstream builds it from {t['source']} but never runs it (that file's RUN lines run "
                      f"{', '.join(ran) or 'nothing'})")
        if reason:
            entry["excluded"] = reason
            programs.append(entry)
            continue
        prefixes = {p for r in runs for p in r["check_prefixes"]}
        entry.update({"runs": runs, "checks": parse_checks(text(t["source"]), prefixes),
                      "mask": MASKS.get(t["base"], []), "flags": EXTRA_FLAGS.get(t["base"], []),
                      "force_annotations_upstream": t["force_annotations"], "note": NOTES.get(t["base"], "")})
        programs.append(entry)

    used = {p["source"] for p in programs}
    lit_files = [f for f in mirror.files(TESTS_DIR) if f.endswith(".cpp") and "RUN:" in text(f[len(TESTS_DIR) + 1:])]
    return {"upstream": {"repo": UPSTREAM_REPO, "commit": mirror.commit, "dir": TESTS_DIR,
                         "cmake_assumed": {"PROTEUS_ENABLE_CUDA": True, "LLVM_VERSION_MAJOR": llvm_major}},
            "programs": programs,
            "lit_files_not_built_for_cuda": sorted(set(lit_files) - used)}


def validate(doc: dict) -> list[str]:
    """Problems with programs.json, as sentences (empty: well-formed). The unit test calls this."""
    problems, seen = [], set()
    for p in doc.get("programs", []):
        name = p.get("name", "?")
        if name in seen:
            problems.append(f"{name}: listed twice")
        seen.add(name)
        for key, typ in (("name", str), ("source", str), ("args", list), ("expected_output_source", str),
                         ("sources", list)):
            if not isinstance(p.get(key), typ):
                problems.append(f"{name}: {key} missing or not a {typ.__name__}")
        if p.get("excluded") is not None:
            if not isinstance(p["excluded"], str) or not p["excluded"] or "\n" in p["excluded"]:
                problems.append(f"{name}: excluded must be a one-line reason")
            continue
        if not p.get("runs"):
            problems.append(f"{name}: no RUN line runs it")
        if not any(c["directive"] != "NOT" for c in p.get("checks", [])):
            problems.append(f"{name}: no CHECK lines")
        for rx in p.get("mask", []):
            try:
                re.compile(rx)
            except re.error as exc:
                problems.append(f"{name}: mask {rx!r}: {exc}")
    return problems


def load_programs(path: Path = PROGRAMS_JSON) -> dict:
    return json.loads(Path(path).read_text())
