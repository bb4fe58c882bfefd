"""Fetch HeCBench CUDA programs and build each with clang-19 in several recipes, and with nvcc as
their own Makefiles do, for differential testing of proteus-rewrite (run.py runs them on a GPU host).

    python -m bench.corpora.hecbench.build                         # every program, all three recipes
    python -m bench.corpora.hecbench.build --suite paper            # the six programs of the Proteus paper
    python -m bench.corpora.hecbench.build --recipes plain jacobi   # one recipe, one program
    python -m bench.corpora.hecbench.build --pack hecbench.tar.xz   # binaries + inputs + scripts, to carry
    python -m bench.corpora.hecbench.build --recipes nvcc           # nvcc, each program's Makefile flags
    python -m bench.corpora.hecbench.build --check-nvcc             # programs.json's nvcc fields against the Makefiles

Recipes: "plain" (no bitcode: what a user ships), "recommended" (-Xclang -fembed-bitcode=all)
and "fembed-bitcode" (clang's driver flag), the last two from samples/build.py's RECIPES;
"nvcc": /usr/local/cuda/bin/nvcc with the flags of the program's own Makefile (ARCH=sm_90: SASS
and compute_90 PTX), stored in programs.json (nvcc_flags, nvcc_libs, nvcc_rdc; --check-nvcc
derives them again from `make -n` and says where they differ), each source compiled apart and
linked by nvcc (cudart static, nvcc's default), as the Makefile does. A program with a
`recipes` list is built in those recipes only (nvcc-only programs: clang cannot build them).
Sources come from a bare git mirror of HeCBench at the commit programs.json pins (they are
BSD-3 and not copied into this repository) into work/src/NAME; binaries go to
work/build/RECIPE/NAME/main, next to the input files the program reads. work/manifest.json
says, per program and recipe, "ok" or the first error line. A build is redone only when its
command line, the compiler (clang or nvcc), or the program's sources changed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
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
from pathlib import Path

from bench.corpora.hecbench import corpus
from bench.lib.builds import pack_runner, recipe_flags, samples_build

HERE = Path(__file__).resolve().parent

DEFAULT_MIRROR = "/work/.mirror/zjin-lcf+HeCBench/repo"
LIBS = ("-lcudart_static", "-ldl", "-lrt", "-lpthread")
_manifest_lock = threading.Lock()
_fetch_lock = threading.Lock()  # two recipes of one program must not extract it at once


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- fetching -----------------------------------------------------------------------------

def fetch(program: dict, mirror: Path, commit: str, src_root: Path) -> Path:
    """Extract src/NAME-cuda at `commit` into src_root/NAME, once per commit. git archive may
    complain about unrelated objects a partial mirror lacks; what matters is that the
    program's sources arrived."""
    with _fetch_lock:
        return _fetch(program, mirror, commit, src_root)


def _fetch(program: dict, mirror: Path, commit: str, src_root: Path) -> Path:
    dest = src_root / program["name"]
    stamp = dest / ".hecbench-commit"
    if stamp.exists() and stamp.read_text().strip() == commit:
        return dest
    tmp = src_root / f".{program['name']}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(mirror), "archive", commit, program["folder"]],
                             capture_output=True)
    if archive.returncode != 0 and not archive.stdout:
        raise RuntimeError(f"git archive {program['folder']}: {archive.stderr.decode(errors='replace').strip()}")
    untar = subprocess.run(["tar", "-x", "-C", str(tmp), "--strip-components=2"], input=archive.stdout,
                           capture_output=True)
    missing = [s for s in [*program["sources"], *program.get("cxx_sources", []), *program["inputs"]]
               if not (tmp / s).exists()]
    if untar.returncode != 0 or missing:
        raise RuntimeError(f"fetch {program['folder']}: missing {', '.join(missing) or '?'} "
                           f"{untar.stderr.decode(errors='replace').strip()}")
    (tmp / ".hecbench-commit").write_text(commit + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest


# --- building -----------------------------------------------------------------------------

def compile_command(program: dict, recipe: str, src: Path, exe: Path, env: "BuildEnv") -> list[str]:
    """One clang invocation: every .cu (and any .cpp the program's Makefile builds as CUDA) as
    CUDA, then the host-only C/C++ files, linked against the static CUDA runtime (shared-lib:
    into the program's library, shared_library(exe), instead)."""
    objects = [str(host_object(exe, s)) for s in program.get("cxx_sources", [])]
    shared = ["-fPIC", "-shared"] if recipe == corpus.SHARED_LIB else []
    return [env.clang, "-x", "cuda", f"--cuda-gpu-arch={env.arch}", f"--cuda-path={env.tree}",
            "-I", str(env.stubs), "-I", str(env.cuda / "include" / "cccl"), "-I", str(src),
            "-O3", "-std=c++17", "-Wno-unknown-cuda-version", *recipe_flags(recipe), *shared,
            *program["flags"], *[str(src / s) for s in program["sources"]],
            *(["-x", "none", *objects] if objects else []),
            "-L", str(env.cuda / "lib64"), *LIBS, "-o", str(shared_library(program, exe) if shared else exe)]


def shared_library(program: dict, exe: Path) -> Path:
    return exe.parent / f"lib{program['name']}.so"


def launcher_command(program: dict, exe: Path, env: "BuildEnv") -> list[str]:
    """shared-lib: an executable with no code of its own; its main is the library's, found beside
    it through $ORIGIN."""
    return [env.clang, "-o", str(exe), "-L", str(exe.parent), f"-l{program['name']}", "-Wl,-rpath,$ORIGIN"]


def host_object(exe: Path, source: str) -> Path:
    return exe.parent / ".objs" / (Path(source).name + ".o")


def host_commands(program: dict, recipe: str, src: Path, exe: Path, env: "BuildEnv") -> list[list[str]]:
    """Host-only files (nvcc builds a .cpp as plain C++) compiled on their own: as C++ they do
    not get CUDA mode's include paths, and the CUDA files must not get the toolkit's include
    directory ahead of clang's wrapper headers."""
    pic = ["-fPIC"] if recipe == corpus.SHARED_LIB else []
    return [[env.clang, "-x", "c++", "-O3", "-std=c++17", *pic, "-I", str(src), "-I", str(env.cuda / "include"),
             *program["flags"], "-c", str(src / s), "-o", str(host_object(exe, s))]
            for s in program.get("cxx_sources", [])]


def nvcc_files(program: dict) -> list[str]:
    """What the nvcc recipe compiles: the CUDA sources, then the host-only C++ files (nvcc builds
    a .cpp as host C++ with the same flags, as the Makefile does)."""
    return [*program["sources"], *program.get("cxx_sources", [])]


def nvcc_object(exe: Path, source: str) -> Path:
    return exe.parent / ".objs" / (Path(source).name + ".o")


def nvcc_commands(program: dict, src: Path, exe: Path, env: "BuildEnv") -> list[list[str]]:
    """The Makefile's build with nvcc: each file compiled apart (-c, or -dc where the Makefile
    asks for relocatable device code), then linked by nvcc with the same flags and the
    Makefile's libraries. nvcc links cudart statically by default."""
    flags = list(program["nvcc_flags"])
    objects = [str(nvcc_object(exe, s)) for s in nvcc_files(program)]
    compile_flag = "-dc" if program.get("nvcc_rdc") else "-c"
    return [*[[env.nvcc, *flags, compile_flag, str(src / s), "-o", o] for s, o in zip(nvcc_files(program), objects)],
            [env.nvcc, *flags, *objects, "-o", str(exe), *program.get("nvcc_libs", [])]]


SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")


def makefile_nvcc(src: Path, arch: str = "sm_90") -> dict:
    """Derive the nvcc recipe's fields from the program's own Makefile: the commands
    `make -n -B ARCH=arch CC=nvcc` prints (its defaults otherwise: -D defines, fast math, -dc).
    Returns {"nvcc_flags", "nvcc_libs", "nvcc_rdc", "files"}; raises ValueError where the
    Makefile does something the recipe cannot express (flags differing between files)."""
    proc = subprocess.run(["make", "-n", "-B", f"ARCH={arch}", "CC=nvcc"], cwd=src, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"make -n: {proc.stderr.strip()[:200]}")
    compile_flags: list[list[str]] = []
    files: list[str] = []
    link: tuple[list[str], list[str]] | None = None
    rdc = False
    for line in proc.stdout.splitlines():
        words = shlex.split(line)
        if not words or Path(words[0]).name != "nvcc":
            continue
        words = words[1:]
        out = words.index("-o") if "-o" in words else None
        target = words[out + 1] if out is not None else None
        after = words[out + 2:] if out is not None else []
        before = words[:out] if out is not None else words
        sources = [w for w in before if w.endswith(SOURCE_SUFFIXES)]
        flags = [w for w in before if w not in ("-c", "-dc") and not w.endswith((*SOURCE_SUFFIXES, ".o"))]
        rdc = rdc or "-dc" in before or "-rdc=true" in before
        if "-c" in before or "-dc" in before:
            compile_flags.append(flags)
            files += [os.path.normpath(s) for s in sources]
        else:  # the link (lud: compile and link in one line)
            if link is not None:
                raise ValueError(f"two link lines ({target})")
            link = (flags, after)
            if sources:
                compile_flags.append(flags)
                files += [os.path.normpath(s) for s in sources]
    if link is None or not files:
        raise ValueError("no nvcc link line in make -n")
    if any(f != link[0] for f in compile_flags):
        raise ValueError(f"flags differ between compile and link lines: {compile_flags} vs {link[0]}")
    return {"nvcc_flags": link[0], "nvcc_libs": link[1], "nvcc_rdc": rdc, "files": files}


def nvcc_mismatches(program: dict, derived: dict) -> list[str]:
    """Where programs.json's nvcc fields differ from what the Makefile says (empty: they agree)."""
    problems = []
    for key in ("nvcc_flags", "nvcc_libs", "nvcc_rdc"):
        have = program.get(key, [] if key != "nvcc_rdc" else False)
        if have != derived[key]:
            problems.append(f"{program['name']}: {key} {have} but the Makefile says {derived[key]}")
    if sorted(derived["files"]) != sorted(nvcc_files(program)):
        problems.append(f"{program['name']}: sources {nvcc_files(program)} but the Makefile compiles {derived['files']}")
    return problems


def first_error(stderr: str) -> str:
    """The line a person wants from a failed build: clang's first error, or the backend's
    "Cannot select" / LLVM ERROR, or the last line when nothing looks like an error."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    # ptxas's own line before clang's "ptxas command failed"
    for pattern in (r"Cannot select", r"LLVM ERROR", r"^ptxas.*(error|fatal)", r"\berror\b", r"undefined reference"):
        for line in lines:
            if re.search(pattern, line):
                # ptxas names a temporary file: drop it, the line then reads the same every build
                return re.sub(r"\s/tmp/\S+\.s, line \d+;", ":", line)[:300]
    return (lines[-1] if lines else "failed without a message")[:300]


def source_digest(src: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".hecbench")):
        h.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_one(program: dict, recipe: str, src: Path, env: "BuildEnv") -> dict:
    """Build one program in one recipe into build/RECIPE/NAME/; returns its manifest entry."""
    out = env.build_root / recipe / program["name"]
    out.mkdir(parents=True, exist_ok=True)
    exe, tmp, stamp = out / "main", out / ".main.tmp", out / ".stamp"
    if recipe == corpus.NVCC:
        cmds, compiler = nvcc_commands(program, src, tmp, env), env.nvcc_version
    else:
        cmds = [*host_commands(program, recipe, src, tmp, env), compile_command(program, recipe, src, tmp, env)]
        compiler = env.clang_version
    if recipe == corpus.SHARED_LIB:
        cmds.append(launcher_command(program, tmp, env))
    key = hashlib.sha256(json.dumps([cmds, compiler, source_digest(src)]).encode()).hexdigest()
    previous = json.loads(stamp.read_text()) if stamp.exists() else None
    if previous and previous.get("key") == key and (exe.exists() or previous["entry"]["status"] != "ok"):
        return {**previous["entry"], "rebuilt": False}

    t0 = time.monotonic()
    host_object(tmp, "x").parent.mkdir(exist_ok=True)
    log_text = ""
    for cmd in cmds:  # the host objects first, the CUDA compile and link last
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src)
        log_text += " ".join(cmd) + "\n" + proc.stdout + proc.stderr + "\n"
        if proc.returncode != 0:
            break
    seconds = round(time.monotonic() - t0, 1)
    (out / "build.log").write_text(log_text)
    shutil.rmtree(host_object(tmp, "x").parent, ignore_errors=True)
    if proc.returncode == 0:
        tmp.replace(exe)
        copy_inputs(program, src, out)
        entry = {"status": "ok", "seconds": seconds, "size": exe.stat().st_size}
    else:
        tmp.unlink(missing_ok=True)
        exe.unlink(missing_ok=True)  # a stale binary must not pass for this build
        # paths relative to the program's folder: the line reads the same on every machine
        entry = {"status": "failed", "seconds": seconds, "error": first_error(proc.stderr.replace(f"{src}/", ""))}
    stamp.write_text(json.dumps({"key": key, "entry": entry}))
    return {**entry, "rebuilt": True}


def copy_inputs(program: dict, src: Path, out: Path) -> None:
    """The files the program reads at run time, next to the binary: run.py runs it there."""
    for rel in program["inputs"]:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (src / rel).is_dir():
            shutil.copytree(src / rel, target, dirs_exist_ok=True)
        else:
            shutil.copy2(src / rel, target)


def ignore_work_dir(work: Path) -> None:
    """A .gitignore of "*" inside the work folder: hundreds of MiB of sources and binaries
    must not show as untracked, nor travel with copies of the working tree."""
    work.mkdir(parents=True, exist_ok=True)
    ignore = work / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by bench/corpora/hecbench/build.py: sources and builds stay out of git\n*\n")


class BuildEnv:
    """Tools and paths every build shares: clang, nvcc, the CUDA toolkit, the compat tree."""

    def __init__(self, args: argparse.Namespace):
        self.sb = samples_build
        self.clang, self.arch, self.cuda = args.clang, args.arch, Path(args.cuda_path)
        self.nvcc = getattr(args, "nvcc", None) or str(self.cuda / "bin" / "nvcc")
        self.work = Path(args.work).resolve()
        ignore_work_dir(self.work)
        self.build_root = self.work / "build"
        self.tree, self.stubs = self.sb.make_compat_tree(self.work, self.cuda)
        self.clang_version = _version_line([self.clang, "--version"])
        self.nvcc_version = _version_line([self.nvcc, "--version"], last=True)


def _version_line(cmd: list[str], last: bool = False) -> str:
    """A compiler's version line ("" where it is not installed: a recipe of the other compiler
    needs nothing of it)."""
    try:
        lines = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return ""
    lines = [l for l in lines if l.strip()]
    return (lines[-1] if last else lines[0]) if lines else ""


# --- the manifest and the CLI ---------------------------------------------------------------

def update_manifest(path: Path, name: str, recipe: str, entry: dict, header: dict) -> None:
    """Merge one result into manifest.json (builds of other programs stay as they were)."""
    with _manifest_lock:
        doc = json.loads(path.read_text()) if path.exists() else {"programs": {}}
        doc.update(header)
        entry = {k: v for k, v in entry.items() if k != "rebuilt"}
        doc["programs"].setdefault(name, {})[recipe] = entry
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)


def prune_manifest(path: Path, names: set[str]) -> None:
    """Forget programs programs.json no longer lists (their old builds are not packed)."""
    with _manifest_lock:
        doc = json.loads(path.read_text())
        doc["programs"] = {n: v for n, v in doc["programs"].items() if n in names}
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def build_all(programs: list[dict], recipes: list[str], args: argparse.Namespace, doc: dict) -> dict:
    env = BuildEnv(args)
    mirror, commit = Path(args.mirror), doc["hecbench"]["commit"]
    manifest = env.work / "manifest.json"
    header = {"hecbench_commit": commit, "clang": env.clang_version, "arch": env.arch,
              "cuda": str(env.cuda), "recipes": {r: recipe_text(r) for r in corpus.RECIPES}}
    if corpus.NVCC in recipes:
        header["nvcc"] = env.nvcc_version
    counts: dict[str, dict[str, int]] = {r: {"ok": 0, "failed": 0} for r in recipes}
    jobs = [(p, r) for p in programs for r in recipes if r in corpus.program_recipes(p)]
    done = [0]

    def work(job: tuple[dict, str]) -> None:
        program, recipe = job
        try:
            src = fetch(program, mirror, commit, env.work / "src")
            entry = build_one(program, recipe, src, env)
        except Exception as exc:  # a fetch problem is this program's failure, not the run's
            entry = {"status": "failed", "error": str(exc)[:300], "rebuilt": True}
        update_manifest(manifest, program["name"], recipe, entry, header)
        with _manifest_lock:
            done[0] += 1
            counts[recipe][entry["status"]] += 1
            rebuilt = entry.get("rebuilt")
            what = (("built in " + str(entry.get("seconds", "?")) + " s" if rebuilt else "up to date")
                    if entry["status"] == "ok" else "FAILED" if rebuilt else "FAILED (unchanged since)")
            error = f": {entry['error']}" if entry["status"] != "ok" else ""
            log(f"[{done[0]}/{len(jobs)}] {recipe:15} {program['name']}: {what}{error}")

    # Programs in order, their recipes together: a fetch happens once, before its builds.
    for program in programs:
        fetch_safely(program, mirror, commit, env.work / "src")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(work, jobs))
    prune_manifest(manifest, {p["name"] for p in doc["programs"]})
    for recipe, c in counts.items():
        log(f"{recipe:15} ok {c['ok']:3}  failed {c['failed']:3}")
    return counts


def recipe_text(recipe: str) -> str:
    if recipe == corpus.NVCC:
        return "nvcc, each program's Makefile flags (programs.json: nvcc_flags, nvcc_libs, nvcc_rdc)"
    return " ".join(recipe_flags(recipe))


def check_nvcc(programs: list[dict], args: argparse.Namespace, doc: dict) -> int:
    """Derive the nvcc fields of every program from its Makefile again and print where
    programs.json differs (or lacks them); 1 when anything differs."""
    work = Path(args.work).resolve()
    ignore_work_dir(work)
    problems = []
    for program in programs:
        if corpus.NVCC not in corpus.program_recipes(program):
            continue
        try:
            src = fetch(program, Path(args.mirror), doc["hecbench"]["commit"], work / "src")
            problems += nvcc_mismatches(program, makefile_nvcc(src, args.arch))
        except (RuntimeError, ValueError) as exc:
            problems.append(f"{program['name']}: {exc}")
    for p in problems:
        print(p)
    log(f"checked {len(programs)} programs against their Makefiles: {len(problems)} differences")
    return 1 if problems else 0


def fetch_safely(program: dict, mirror: Path, commit: str, src_root: Path) -> None:
    try:
        fetch(program, mirror, commit, src_root)
    except Exception as exc:  # reported again, per recipe, when the build needs the sources
        log(f"fetch {program['name']}: {exc}")


def pack(out_path: Path, work: Path, programs: list[dict], recipes: list[str]) -> None:
    """A tarball with the repository's layout, for `python3 -m bench.corpora.hecbench.run` from its
    top (bench/corpora/hecbench/run.py, .../work/build/...): binaries, their inputs,
    programs.json, the manifest and the runner's modules; no sources, no build logs. Recipes of
    one program sit together so that xz's window sees their identical static cudart and
    compresses it away."""
    manifest = json.loads((work / "manifest.json").read_text())
    names = [p["name"] for p in programs]
    # the manifest of what is packed only: the programs and recipes asked for
    packed = {**manifest, "programs": {n: {r: e for r, e in manifest["programs"].get(n, {}).items() if r in recipes}
                                       for n in names if n in manifest["programs"]}}
    with tarfile.open(out_path, "w:xz", preset=9) as tar:  # 9: a 64 MiB window spans many binaries
        top = pack_runner(tar, HERE, ("run.py", "corpus.py", "programs.json", "README.md"))
        data = (json.dumps(packed, indent=1, sort_keys=True) + "\n").encode()
        info = tarfile.TarInfo(f"{top}/work/manifest.json")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
        count = 0
        for name in names:
            for recipe, entry in manifest["programs"].get(name, {}).items():
                if recipe not in recipes:
                    continue
                folder = work / "build" / recipe / name
                if entry.get("status") != "ok" or not (folder / "main").exists():
                    continue
                for path in sorted(folder.rglob("*")):
                    if path.is_file() and path.name not in ("build.log", ".stamp") and not path.name.startswith(".main"):
                        tar.add(path, arcname=f"{top}/work/build/{recipe}/{name}/{path.relative_to(folder)}")
                count += 1
    log(f"packed {count} binaries into {out_path} ({out_path.stat().st_size / 2**20:.1f} MiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="programs to build (default: all of --suite)")
    parser.add_argument("--suite", choices=("paper", "corpus", "all"), default="all")
    parser.add_argument("--recipes", default=",".join(corpus.RECIPES),
                        help="comma-separated, from: " + ", ".join(corpus.RECIPES))
    parser.add_argument("-j", "--jobs", type=int, default=2, help="builds in parallel (default 2)")
    parser.add_argument("--work", default=str(HERE / "work"), help="sources, builds, manifest (default: %(default)s)")
    parser.add_argument("--mirror", default=os.environ.get("HECBENCH_MIRROR", DEFAULT_MIRROR),
                        help="bare git mirror of HeCBench (default: %(default)s)")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang++-19"))
    parser.add_argument("--cuda-path", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
    parser.add_argument("--nvcc", default=os.environ.get("NVCC"),
                        help="nvcc of the nvcc recipe (default: CUDA_PATH/bin/nvcc)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--pack", metavar="OUT.tar.xz",
                        help="pack what was built (of --suite, --recipes, names) instead of building")
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    parser.add_argument("--check-nvcc", action="store_true",
                        help="derive the nvcc fields from each program's Makefile (make -n) and print where "
                             "programs.json differs; exit 1 when anything does")
    args = parser.parse_args(argv)

    doc = corpus.load_programs()
    problems = corpus.validate(doc)
    if problems:
        raise SystemExit("programs.json: " + "; ".join(problems))
    programs = corpus.select(doc, args.suite, args.names)
    if args.list:
        for p in programs:
            print(f"{p['name']:26} {p['suite']:7} {','.join(p['tags'])}")
        return 0
    if args.check_nvcc:
        return check_nvcc(programs, args, doc)
    recipes = [r for r in args.recipes.split(",") if r]
    bad = [r for r in recipes if r not in corpus.RECIPES]
    if bad:
        parser.error(f"unknown recipe(s): {', '.join(bad)}")
    if args.pack:
        pack(Path(args.pack).resolve(), Path(args.work).resolve(), programs, recipes)
        return 0
    nvcc = args.nvcc or str(Path(args.cuda_path) / "bin" / "nvcc")
    if corpus.NVCC in recipes and shutil.which(nvcc) is None:
        raise SystemExit(f"{nvcc} not found (the CUDA toolkit, or --nvcc)")
    if any(r != corpus.NVCC for r in recipes) and shutil.which(args.clang) is None:
        raise SystemExit(f"{args.clang} not found (apt-get install clang-19); builds happen off the GPU host")
    build_all(programs, recipes, args, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
