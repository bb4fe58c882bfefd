"""Build upstream Proteus's CUDA GPU test programs (Olympus-HPC/proteus, tests/gpu) without
Proteus's compiler plugin, to run them natively and under proteus-rewrite (run.py, on a GPU host).

    python -m bench.corpora.upstream_tests.build                      # every program, plain + recommended
    python -m bench.corpora.upstream_tests.build kernel daxpy.rdc     # some programs
    python -m bench.corpora.upstream_tests.build --update-programs    # re-read upstream into programs.json
    python -m bench.corpora.upstream_tests.build --pack tests.tar.xz  # binaries + run.py + what RUN lines read

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

from bench.corpora.upstream_tests.upstream import (
    DEFAULT_MIRROR,
    PROGRAMS_JSON,
    TESTS_DIR,
    Mirror,
    describe_programs,
    load_programs,
    validate,
)
from bench.lib.builds import pack_runner, recipe_flags, samples_build

HERE = Path(__file__).resolve().parent
STUBS_SOURCE = HERE / "stubs" / "proteus_host_stubs.cpp"
RECIPES = ("plain", "recommended")
LIBS = ("-lcudart_static", "-ldl", "-lrt", "-lpthread")
PACK_LIMIT = 15 * 2**20
_lock = threading.Lock()

# The flag every program gets from upstream's proteus target (gpu_common.h needs it).
DEFINES = ("-DPROTEUS_ENABLE_CUDA",)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- building --------------------------------------------------------------------------------

class BuildEnv:
    """What every build shares: clang, the CUDA toolkit, the compat tree, the sources, the stubs."""

    def __init__(self, args: argparse.Namespace, commit: str):
        self.sb = samples_build
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
                *DEFINES, "-O3", "-std=c++17", "-Wno-unknown-cuda-version", *recipe_flags(recipe),
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
        ignore.write_text("# written by bench/corpora/upstream_tests/build.py: sources and builds stay out of git\n*\n")


def build_all(programs: list[dict], recipes: list[str], args: argparse.Namespace, doc: dict) -> int:
    env = BuildEnv(args, doc["upstream"]["commit"])
    manifest_path = env.work / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"programs": {}}
    manifest.update({"upstream_commit": doc["upstream"]["commit"], "clang": env.clang_version,
                     "arch": env.arch, "recipes": {r: " ".join(recipe_flags(r)) for r in RECIPES}})
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
    """A tarball with the repository's layout, for `python3 -m bench.corpora.upstream_tests.run`
    from its top (bench/corpora/upstream_tests/run.py, .../work/build/...). A program's recipes
    sit together so that xz's window sees their identical static cudart."""
    manifest = json.loads((work / "manifest.json").read_text())
    needed = run_line_files(doc if doc is not None else load_programs())
    missing = [f for f in needed if not (work / "src" / f).is_file()]
    if missing:
        raise SystemExit(f"{work / 'src'} lacks {', '.join(missing)} (RUN lines name them): run build.py first")
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        top = pack_runner(tar, HERE, ("run.py", "checks.py", "programs.json", "README.md"))
        tar.add(work / "manifest.json", arcname=f"{top}/work/manifest.json")
        for rel in needed:
            tar.add(work / "src" / rel, arcname=f"{top}/work/src/{rel}")
        count = 0
        for name, builds in sorted(manifest["programs"].items()):
            for recipe, entry in builds.items():
                exe = work / "build" / recipe / name
                if entry.get("status") == "ok" and exe.exists():
                    tar.add(exe, arcname=f"{top}/work/build/{recipe}/{name}")
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
