"""Build NVIDIA cuda-samples with nvcc, as their CMakeLists.txt do, for running natively and
under proteus-rewrite on a GPU host (run.py).

    python -m bench.corpora.cuda_samples.build                       # every sample of samples.json
    python -m bench.corpora.cuda_samples.build vectorAdd matrixMul   # two of them
    python -m bench.corpora.cuda_samples.build --pack OUT.tar.xz     # binaries + runner, to carry

Sources come from a bare git mirror of NVIDIA/cuda-samples (not copied into this repository)
into work/src/ (the repository's layout: Samples/..., Common/); binaries go to
work/bin/NAME/NAME. The flags are those CMake gives a sample's target: its sources from
add_executable, --extended-lambda, C++17, -lineinfo, and -rdc=true for
CUDA_SEPARABLE_COMPILATION, with one architecture, sm_90 (SASS and compute_90 PTX, as
CMAKE_CUDA_ARCHITECTURES 90 would give). work/manifest.json says, per sample, "ok" or the
first error line, and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib.builds import pack_runner

HERE = Path(__file__).resolve().parent
DEFAULT_MIRROR = "/work/.mirror/NVIDIA+cuda-samples/repo"
CUDA = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))
ARCH = "sm_90"
RUNNER_FILES = ("run.py", "samples.json")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_samples(path: Path = HERE / "samples.json") -> list[dict]:
    return json.loads(path.read_text())["samples"]


def git_dir(mirror: str) -> Path:
    """The mirror's git directory: the path itself (bare) or repo/ inside it."""
    path = Path(mirror)
    for candidate in (path, path / "repo", path / ".git"):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    raise SystemExit(f"{mirror}: no git repository there (--mirror)")


def git(gdir: Path, *args: str, binary: bool = False) -> str | bytes:
    proc = subprocess.run(["git", "--git-dir", str(gdir), *args], capture_output=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout if binary else proc.stdout.decode()


def extract(gdir: Path, commit: str, paths: list[str], dest: Path) -> list[str]:
    """The files of `paths` at `commit` under dest/, read blob by blob: the mirror may be a
    partial clone without large blobs (the samples' doc/ files), which git archive refuses.
    Returns the paths whose blobs are missing."""
    listing = git(gdir, "ls-tree", "-r", "-z", commit, "--", *paths).split("\0")
    blobs = []
    for row in filter(None, listing):
        meta, path = row.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and mode != "120000":
            blobs.append((sha, path, mode))
    proc = subprocess.run(["git", "--git-dir", str(gdir), "cat-file", "--batch"], capture_output=True,
                          input="".join(f"{sha}\n" for sha, _, _ in blobs).encode(), check=True)
    out, pos, missing = proc.stdout, 0, []
    for sha, path, mode in blobs:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode().split()
        pos = end + 1
        if header[-1] == "missing":
            missing.append(path)
            continue
        size = int(header[2])
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(out[pos:pos + size])
        if mode == "100755":
            target.chmod(0o755)
        pos += size + 1
    return missing


def cmake_target(cmake: str, name: str) -> dict:
    """What the sample's CMakeLists.txt gives its target: sources, separable compilation,
    linked libraries (the CUDA:: targets of find_package(CUDAToolkit))."""
    found = re.search(rf"add_executable\(\s*{re.escape(name)}\s+([^)]*)\)", cmake)
    if not found:
        raise ValueError(f"no add_executable({name} ...) in its CMakeLists.txt")
    sources = found.group(1).split()
    libs = []
    for block in re.findall(rf"target_link_libraries\(\s*{re.escape(name)}\s+([^)]*)\)", cmake):
        for item in block.split():
            if item.startswith("CUDA::"):
                libs.append("-l" + item.removeprefix("CUDA::").removesuffix("_static"))
    separable = bool(re.search(rf"set_target_properties\(\s*{re.escape(name)}\s+PROPERTIES[^)]*"
                               r"CUDA_SEPARABLE_COMPILATION\s+ON", cmake))
    return {"sources": sources, "libs": libs, "rdc": separable,
            "extended_lambda": "--extended-lambda" in cmake}


def nvcc_command(sample: dict, target: dict, src: Path, out: Path) -> list[str]:
    folder = src / sample["path"]
    cmd = [str(CUDA / "bin" / "nvcc"), "-O3", f"-arch={ARCH}", "-std=c++17", "-lineinfo",
           "-Wno-deprecated-gpu-targets", f"-I{src / 'Common'}", f"-I{folder}"]
    if target["extended_lambda"]:
        cmd.append("--extended-lambda")
    if target["rdc"]:
        cmd.append("-rdc=true")
    cmd += [str(folder / s) for s in target["sources"]]
    return cmd + ["-o", str(out), *target["libs"]]


def build_one(sample: dict, gdir: Path, commit: str, work: Path) -> dict:
    name = sample["name"]
    src, out_dir = work / "src", work / "bin" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    entry: dict = {"path": sample["path"], "commit": commit}
    t0 = time.monotonic()
    try:
        cmake = (src / sample["path"] / "CMakeLists.txt").read_text()
        target = cmake_target(cmake, name)
        entry["cmake"] = target
        cmd = nvcc_command(sample, target, src, out_dir / name)
        entry["command"] = shlex.join(cmd)
        # nvcc writes its intermediate files into the working directory: one folder each, so
        # that samples build in parallel
        proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True)
        (work / "logs").mkdir(exist_ok=True)
        (work / "logs" / f"{name}.log").write_text(f"$ {entry['command']}\n{proc.stdout}{proc.stderr}")
        if proc.returncode:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()] or proc.stderr.splitlines() or ["?"]
            entry.update(status="failed", error=errors[0][:300])
        else:
            for rel in sample.get("data", []):  # inputs a sample reads from its working directory
                data = src / sample["path"] / rel
                (out_dir / Path(rel).name).write_bytes(data.read_bytes())
            entry.update(status="ok", bytes=(out_dir / name).stat().st_size)
    except (OSError, ValueError, RuntimeError) as exc:
        entry.update(status="failed", error=str(exc)[:300])
    entry["seconds"] = round(time.monotonic() - t0, 1)
    log(f"{name}: {entry['status']}{': ' + entry['error'] if entry['status'] != 'ok' else ''} ({entry['seconds']} s)")
    return entry


def nvcc_version() -> str:
    try:
        out = subprocess.run([str(CUDA / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    return (out.strip().splitlines() or ["unknown"])[-1]


def build(samples: list[dict], mirror: str, work: Path, jobs: int) -> dict:
    gdir = git_dir(mirror)
    commit = git(gdir, "rev-parse", "HEAD").strip()
    work.mkdir(parents=True, exist_ok=True)
    # the folder holds sources under NVIDIA's license and build outputs: never committed
    (work / ".gitignore").write_text("*\n")
    missing = extract(gdir, commit, ["Common", *sorted({s["path"] for s in samples})], work / "src")
    if missing:  # a needed one fails the build that reads it, with its name in the error
        log(f"not in the mirror ({len(missing)}): {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    manifest_path = work / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"samples": {}}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        entries = list(pool.map(lambda s: build_one(s, gdir, commit, work), samples))
    for sample, entry in zip(samples, entries):
        manifest["samples"][sample["name"]] = entry
    manifest.update(cuda_samples_commit=commit, nvcc=nvcc_version(), arch=ARCH)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def pack(out_path: Path, work: Path, samples: list[dict]) -> None:
    """A tarball with the repository's layout, run from its top as
    `python3 -m bench.corpora.cuda_samples.run`: the runner, samples.json, the manifest and the
    built binaries with their inputs; no sources."""
    manifest = json.loads((work / "manifest.json").read_text())
    count = 0
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out_path, "w:xz", preset=9) as tar:  # 9: one window spans the binaries' shared cudart
        top = pack_runner(tar, HERE, RUNNER_FILES)
        tar.add(work / "manifest.json", arcname=f"{top}/work/manifest.json")
        for sample in samples:
            entry = manifest["samples"].get(sample["name"], {})
            folder = work / "bin" / sample["name"]
            if entry.get("status") != "ok" or not (folder / sample["name"]).exists():
                log(f"{sample['name']}: not built, not packed")
                continue
            for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
                tar.add(path, arcname=f"{top}/work/bin/{sample['name']}/{path.name}")
            count += 1
    log(f"packed {count} samples into {out_path} ({out_path.stat().st_size / 2**20:.2f} MiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="samples to build (default: all of samples.json)")
    parser.add_argument("--mirror", default=os.environ.get("CUDA_SAMPLES_MIRROR", DEFAULT_MIRROR),
                        help="git mirror of NVIDIA/cuda-samples (default: %(default)s)")
    parser.add_argument("--work", default=str(HERE / "work"), help="sources, builds, manifest (default: %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--pack", metavar="OUT.tar.xz", help="pack what was built instead of building")
    args = parser.parse_args(argv)
    samples = load_samples()
    unknown = set(args.names) - {s["name"] for s in samples}
    if unknown:
        parser.error(f"not in samples.json: {', '.join(sorted(unknown))}")
    if args.names:
        samples = [s for s in samples if s["name"] in args.names]
    work = Path(args.work).resolve()
    if args.pack:
        pack(Path(args.pack).resolve(), work, samples)
        return 0
    manifest = build(samples, args.mirror, work, args.jobs)
    failed = [s["name"] for s in samples if manifest["samples"][s["name"]]["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
