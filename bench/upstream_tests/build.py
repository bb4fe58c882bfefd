#!/usr/bin/env python3
"""Build upstream Proteus's CUDA GPU test programs (Olympus-HPC/proteus, tests/gpu) without
Proteus's compiler plugin, to run them natively and under proteus-rewrite (run.py, on a GPU host).

    python3 bench/upstream_tests/build.py                      # every program, plain + recommended
    python3 bench/upstream_tests/build.py kernel daxpy.rdc     # some programs
    python3 bench/upstream_tests/build.py --update-programs    # re-read upstream into programs.json
    python3 bench/upstream_tests/build.py --pack tests.tar.xz  # binaries + run.py + what RUN lines read

programs.json is written by --update-programs from the mirror: the executables upstream's
CMakeLists builds for CUDA (LLVM 19, the clang here), their sources, the RUN lines (environment,
FileCheck prefixes) and CHECK lines of each, and for the programs left out, why. Builds use
that file and the commit it pins; sources are extracted from a bare git mirror (never copied
into this repository) into work/src, binaries go to work/build/RECIPE/NAME.

Recipes: "plain" (no bitcode: the reference) and "recommended" (samples/build.py's RECIPES:
-Xclang -fembed-bitcode=all), clang-19 for sm_90 through samples/build.py's CUDA 13 compat
tree, static cudart, like tests/support/clang.py's build_cuda. Upstream's CMake functions map
to: CREATE_GPU_TEST -> one clang invocation; *_RDC -> -fgpu-rdc per file + nvcc -dlink (the
old offload driver, as upstream's --no-offload-new-driver); *_LIBS -> the library's files
compiled with -fgpu-rdc and device-linked into the program.

Without the plugin, upstream's headers (used as they are, from the mirror) declare functions
nobody defines. Host functions that only steer Proteus get do-nothing definitions in
stubs/proteus_host_stubs.cpp (each documented there); a program that needs more than that
(device-side proteus::jit_arg, lambda registration, kernel metadata) is excluded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import recipe_flags, samples_build  # noqa: E402  (bench/harness.py)
PROGRAMS_JSON = HERE / "programs.json"
STUBS_SOURCE = HERE / "stubs" / "proteus_host_stubs.cpp"
DEFAULT_MIRROR = "/work/.mirror/Olympus-HPC+proteus/repo"
UPSTREAM_REPO = "https://github.com/Olympus-HPC/proteus"
TESTS_DIR = "tests/gpu"
RECIPES = ("plain", "recommended")
LIBS = ("-lcudart_static", "-ldl", "-lrt", "-lpthread")
PACK_LIMIT = 15 * 2**20
_lock = threading.Lock()

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
# The flag every program gets from upstream's proteus target (gpu_common.h needs it).
DEFINES = ("-DPROTEUS_ENABLE_CUDA",)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


# --- building --------------------------------------------------------------------------------

class BuildEnv:
    """What every build shares: clang, the CUDA toolkit, the compat tree, the sources, the stubs."""

    def __init__(self, args: argparse.Namespace, commit: str):
        self.sb = samples_build()
        self.clang, self.arch, self.cuda = args.clang, args.arch, Path(args.cuda_path)
        self.work = Path(args.work).resolve()
        ignore_work_dir(self.work)
        self.tree, self.stubs = self.sb.make_compat_tree(self.work, self.cuda)
        self.clang_version = clang_version(self.clang)
        self.src = self.work / "src"
        Mirror(args.mirror, commit).extract(self.src, TESTS_DIR, "include/proteus")
        self.tests = self.src / TESTS_DIR
        self.stub_lib = self._stub_library()
        self.digest = tree_digest(self.src, [STUBS_SOURCE])

    def _stub_library(self) -> Path:
        out = self.work / "stubs"
        out.mkdir(exist_ok=True)
        obj, lib = out / "proteus_host_stubs.o", out / "libproteus_host_stubs.a"
        if not lib.exists() or lib.stat().st_mtime < STUBS_SOURCE.stat().st_mtime:
            run([self.clang, "-x", "c++", "-std=c++17", "-O2", "-fPIC", "-I", str(self.src / "include"),
                 "-c", str(STUBS_SOURCE), "-o", str(obj)])
            lib.unlink(missing_ok=True)
            run(["ar", "rcs", str(lib), str(obj)])  # an archive: only programs that call a stub pull it in
        return lib

    def cuda_flags(self, recipe: str, program: dict) -> list[str]:
        return [self.clang, "-x", "cuda", f"--cuda-gpu-arch={self.arch}", f"--cuda-path={self.tree}",
                "-I", str(self.stubs), "-I", str(self.cuda / "include" / "cccl"), "-I", str(self.src / "include"),
                *DEFINES, "-O3", "-std=c++17", "-Wno-unknown-cuda-version", *recipe_flags(recipe, self.sb),
                *program.get("flags", [])]

    def link_flags(self) -> list[str]:
        return ["-L", str(self.stub_lib.parent), "-lproteus_host_stubs", "-L", str(self.cuda / "lib64"), *LIBS]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise BuildError(cmd, proc.stdout + proc.stderr)
    return proc


class BuildError(Exception):
    def __init__(self, cmd: list[str], output: str):
        super().__init__(first_error(output))
        self.cmd, self.output = cmd, output


def first_error(output: str) -> str:
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    for pattern in (r"\berror\b", r"LLVM ERROR", r"undefined reference", r"fatal"):
        for line in lines:
            if re.search(pattern, line):
                return line[:300]
    return (lines[-1] if lines else "failed without a message")[:300]


def clang_version(clang: str) -> str:
    return subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def llvm_major(clang: str) -> int:
    m = re.search(r"version (\d+)\.", clang_version(clang))
    if not m:
        raise SystemExit(f"cannot tell {clang}'s LLVM version")
    return int(m.group(1))


def tree_digest(root: Path, extra: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()) + extra:
        h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_commands(program: dict, recipe: str, env: BuildEnv, exe: Path, objdir: Path) -> list[list[str]]:
    """The commands that build one program in one recipe, in order."""
    cuda = env.cuda_flags(recipe, program)
    sources = [env.tests / s for s in program["sources"]]
    lib_sources = [env.tests / s for lib in program["libraries"] for s in lib["sources"]]
    if not program["rdc"] and not lib_sources:
        return [[*cuda, *map(str, sources), *env.link_flags(), "-o", str(exe)]]
    cmds, objs, rdc_objs = [], [], []
    for i, src in enumerate(sources + lib_sources):
        rdc = program["rdc"] or i >= len(sources)  # upstream's libraries are always separable
        obj = objdir / f"{i:03d}-{src.stem}.o"
        cmds.append([*cuda, *(["-fgpu-rdc"] if rdc else []), "-c", str(src), "-o", str(obj)])
        objs.append(str(obj))
        if rdc:
            rdc_objs.append(str(obj))
    dlink = objdir / "dlink.o"
    cmds.append([str(env.cuda / "bin" / "nvcc"), "-dlink", f"-arch={env.arch}", *rdc_objs, "-o", str(dlink)])
    cmds.append([env.clang, *objs, str(dlink), *env.link_flags(), "-o", str(exe)])
    return cmds


def build_one(program: dict, recipe: str, env: BuildEnv) -> dict:
    """Build one program into work/build/RECIPE/NAME; returns its manifest entry."""
    out = env.work / "build" / recipe
    out.mkdir(parents=True, exist_ok=True)
    exe, tmp = out / program["name"], out / f".{program['name']}.tmp"
    objdir = env.work / "objs" / recipe / program["name"]
    stamp = env.work / "objs" / recipe / f"{program['name']}.stamp"
    cmds = build_commands(program, recipe, env, tmp, objdir)
    key = hashlib.sha256(json.dumps([cmds, env.clang_version, env.digest]).encode()).hexdigest()
    previous = json.loads(stamp.read_text()) if stamp.exists() else None
    if previous and previous["key"] == key and (exe.exists() or previous["entry"]["status"] != "ok"):
        return {**previous["entry"], "rebuilt": False}
    t0 = time.monotonic()
    shutil.rmtree(objdir, ignore_errors=True)
    objdir.mkdir(parents=True)
    try:
        for cmd in cmds:
            run(cmd, cwd=env.tests)
        tmp.replace(exe)
        entry = {"status": "ok", "size": exe.stat().st_size}
    except BuildError as exc:
        tmp.unlink(missing_ok=True)
        exe.unlink(missing_ok=True)  # a stale binary must not pass for this build
        (objdir / "build.log").write_text(shlex.join(exc.cmd) + "\n" + exc.output)
        entry = {"status": "failed", "error": str(exc).replace(f"{env.tests}/", "")}
    entry["seconds"] = round(time.monotonic() - t0, 1)
    if entry["status"] == "ok":
        shutil.rmtree(objdir, ignore_errors=True)
    stamp.write_text(json.dumps({"key": key, "entry": entry}))
    return {**entry, "rebuilt": True}


def ignore_work_dir(work: Path) -> None:
    """work/ holds extracted sources and binaries: a .gitignore of "*" keeps them out of git
    and off copies of the working tree."""
    work.mkdir(parents=True, exist_ok=True)
    ignore = work / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by bench/upstream_tests/build.py: sources and builds stay out of git\n*\n")


def build_all(programs: list[dict], recipes: list[str], args: argparse.Namespace, doc: dict) -> int:
    env = BuildEnv(args, doc["upstream"]["commit"])
    manifest_path = env.work / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"programs": {}}
    manifest.update({"upstream_commit": doc["upstream"]["commit"], "clang": env.clang_version,
                     "arch": env.arch, "recipes": {r: " ".join(recipe_flags(r, env.sb)) for r in RECIPES}})
    known = {p["name"] for p in doc["programs"] if not p["excluded"]}
    manifest["programs"] = {n: v for n, v in manifest["programs"].items() if n in known}
    jobs = [(p, r) for p in programs for r in recipes]
    failed = [0]

    def work(job: tuple[dict, str]) -> None:
        program, recipe = job
        try:
            entry = build_one(program, recipe, env)
        except Exception as exc:  # one program's trouble is its own, the others still build
            entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300], "rebuilt": True}
        with _lock:
            manifest["programs"].setdefault(program["name"], {})[recipe] = {k: v for k, v in entry.items() if k != "rebuilt"}
            write_json(manifest_path, manifest)
            what = "ok" if entry["status"] == "ok" else f"FAILED: {entry['error']}"
            if entry["status"] != "ok":
                failed[0] += 1
            log(f"{recipe:12} {program['name']}: {what}{'' if entry['rebuilt'] else ' (up to date)'}")

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(work, jobs))
    ok = sum(1 for p in programs if all(manifest["programs"].get(p["name"], {}).get(r, {}).get("status") == "ok"
                                        for r in recipes))
    excluded = [p for p in doc["programs"] if p["excluded"]]
    log(f"{len(doc['programs'])} CUDA programs upstream, {len(excluded)} excluded, "
        f"{ok}/{len(programs)} built in {', '.join(recipes)}")
    return 1 if failed[0] else 0


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


# --- packing ---------------------------------------------------------------------------------

def run_line_files(doc: dict) -> list[str]:
    """Files of upstream's tree that RUN lines name through lit's %S (the test file's folder),
    relative to work/src: run.py's RUN-line runs need them on the GPU host."""
    files = set()
    for p in doc["programs"]:
        if p["excluded"]:
            continue
        folder = PurePosixPath(p["expected_output_source"]).parent
        for line in p.get("runs", []):
            for value in line["env"].values():
                files.update(str(folder / m) for m in re.findall(r"%S/([^\s;:]+)", value))
    return sorted(files)


def pack(out_path: Path, work: Path, doc: dict | None = None) -> None:
    """A tarball with run.py's layout (upstream_tests/run.py, upstream_tests/work/build/...).
    A program's recipes sit together so that xz's window sees their identical static cudart."""
    manifest = json.loads((work / "manifest.json").read_text())
    needed = run_line_files(doc if doc is not None else load_programs())
    missing = [f for f in needed if not (work / "src" / f).is_file()]
    if missing:
        raise SystemExit(f"{work / 'src'} lacks {', '.join(missing)} (RUN lines name them): run build.py first")
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for script in ("run.py", "checks.py", "programs.json", "README.md"):
            tar.add(HERE / script, arcname=f"upstream_tests/{script}")
        tar.add(HERE.parent / "harness.py", arcname="harness.py")  # run.py imports it from its parent folder
        tar.add(work / "manifest.json", arcname="upstream_tests/work/manifest.json")
        for rel in needed:
            tar.add(work / "src" / rel, arcname=f"upstream_tests/work/src/{rel}")
        count = 0
        for name, builds in sorted(manifest["programs"].items()):
            for recipe, entry in builds.items():
                exe = work / "build" / recipe / name
                if entry.get("status") == "ok" and exe.exists():
                    tar.add(exe, arcname=f"upstream_tests/work/build/{recipe}/{name}")
                    count += 1
    tmp.replace(out_path)
    size = out_path.stat().st_size
    log(f"packed {count} binaries into {out_path} ({size / 2**20:.1f} MiB)")
    if size > PACK_LIMIT:
        log(f"warning: over {PACK_LIMIT / 2**20:.0f} MiB")


# --- the CLI ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="programs to build (default: all not excluded)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated, from: " + ", ".join(RECIPES))
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--work", default=str(HERE / "work"), help="sources, builds, manifest (default: %(default)s)")
    parser.add_argument("--mirror", default=os.environ.get("PROTEUS_UPSTREAM_MIRROR", DEFAULT_MIRROR),
                        help="bare git mirror of Olympus-HPC/proteus (default: %(default)s)")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang++-19"))
    parser.add_argument("--cuda-path", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--update-programs", action="store_true",
                        help="re-read upstream (the mirror at --commit) into programs.json, then stop")
    parser.add_argument("--commit", default="HEAD", help="upstream commit for --update-programs (default: HEAD)")
    parser.add_argument("--pack", metavar="OUT.tar.xz", help="pack what was built instead of building")
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    args = parser.parse_args(argv)

    if args.update_programs:
        doc = describe_programs(Mirror(args.mirror, args.commit), llvm_major(args.clang))
        problems = validate(doc)
        if problems:
            raise SystemExit("programs.json would be malformed: " + "; ".join(problems))
        write_json(PROGRAMS_JSON, doc)
        n_ex = sum(1 for p in doc["programs"] if p["excluded"])
        log(f"wrote {PROGRAMS_JSON}: {len(doc['programs'])} programs, {n_ex} excluded, commit {doc['upstream']['commit']}")
        return 0
    doc = load_programs()
    problems = validate(doc)
    if problems:
        raise SystemExit("programs.json: " + "; ".join(problems))
    if args.pack:
        pack(Path(args.pack).resolve(), Path(args.work).resolve(), doc)
        return 0
    wanted = [p for p in doc["programs"] if not p["excluded"]]
    if args.list:
        for p in doc["programs"]:
            print(f"{p['name']:40} {'EXCLUDED: ' + p['excluded'] if p['excluded'] else p['cmake']}")
        return 0
    if args.names:
        known = {p["name"]: p for p in doc["programs"]}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            parser.error(f"unknown program(s): {', '.join(unknown)}")
        excluded = [n for n in args.names if known[n]["excluded"]]
        if excluded:
            parser.error(f"excluded: {', '.join(excluded)} (programs.json says why)")
        wanted = [known[n] for n in args.names]
    recipes = [r for r in args.recipes.split(",") if r]
    if not set(recipes) <= set(RECIPES):
        parser.error(f"--recipes: from {', '.join(RECIPES)}")
    if shutil.which(args.clang) is None:
        raise SystemExit(f"{args.clang} not found (apt-get install clang-19 llvm-19 lld-19); builds happen off the GPU host")
    return build_all(wanted, recipes, args, doc)


if __name__ == "__main__":
    sys.exit(main())
