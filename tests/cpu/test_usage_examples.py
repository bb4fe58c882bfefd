"""The documentation's example commands run as written, and its sample outputs have the shape of
what the commands print.

The examples are every command of docs/user/usage.md's ```sh blocks and of the `$ ` lines in its
sample outputs, and the README's "Use" block. Each runs on a sample app, in a directory of its
own where `./app` is the sample (templates where the doc's sample output shows templates,
loop_count elsewhere), one directory per section, so that `proteus-out/app/...` means what the
section says. A synopsis runs
without its optional `[...]` parts, and with them too where each names only flags or
placeholders this test knows; `ls | stats | clear` runs each alternative. Nothing is skipped
but the examples that run the app itself, which need a GPU (tests/gpu runs those): they are
listed below, so that an example added to the docs that cannot run here fails.

A sample output (a plain block after the examples) is checked line by line: each line's first
words, up to the first one holding a digit, an absolute path or `...` (values that differ
from run to run and machine to machine), must appear in what its commands printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USAGE = ROOT / "docs" / "user" / "usage.md"
README = ROOT / "README.md"

# The sample app `./app` stands for, by the section its example is in: the app the section's
# sample output shows.
SAMPLE_OF_SECTION = {"Looking inside: `inspect`": "templates"}
DEFAULT_SAMPLE = "loop_count"

# The examples that run the app, as the docs write them.
NEEDS_GPU = {
    "./proteus-out/app/app",
    "LD_PRELOAD=$PWD/proteus-out/app/libproteus.so ./app",
    "LD_PRELOAD=./proteus-out/app/libproteus.so ./app",
    "PROTEUS_REPORT=run.json ./proteus-out/app/app",
    "proteus-rewrite validate out/app [--ulps N] [--max-mb MB] [--cache-dir DIR] -- ARGS",
    "proteus-rewrite ./app -o out/ --validate [--ulps N] -- ARGS",
    "proteus-rewrite validate proteus-out/app/app -- ARGS",
    "PROTEUS_REPORT=run.%r.json srun -n 64 ./proteus-out/app/app",
}

# Whole-word placeholders of the synopses, as this test fills them in ({app}: the sample).
PLACEHOLDERS = {"STORE": "proteus-out/{app}/{app}.kstore", "KERNEL": "axpy_loop", "DIR": "dir-{command}"}
# Files the examples name that the sample directory does not hold: a library the app would
# open with dlopen (any ELF with kernels serves `--lib`), and earlier runs' reports.
LIBRARY_STAND_INS = {"libplugin.so": "two_tu"}
AXPY = "_Z9axpy_loopiifPKfPf"


def _launch(iters: int) -> dict:
    return {"args": {"0": (1 << 20).to_bytes(4, "little").hex(), "1": iters.to_bytes(4, "little").hex(),
                     "2": struct.pack("<f", 0.5).hex()},
            "unknown_dims": ["grid"], "arch": 90, "block": [256, 1, 1], "grid": [4096, 1, 1], "globals": {}}


# A report of loop_count as a GPU run writes it (runtime/report.py), with what the doc's sample
# of `report` shows, and variants that `prewarm` compiles.
RUN_REPORT = {
    "tool": "proteus-rewrite 0.1.0", "pid": 4242, "seconds": 1.62, "driver_version": 13000, "async_compilation": "auto",
    "unknown_handle_launches": 0,
    "shim_wait_ms": {"python_start": 92.1, "misses": 2.1, "miss_count": 12, "deferred_count": 10, "compiling": 0.0,
                     "compiling_count": 0, "prepare_compiler": 0.0, "exit": 0.4},
    "prestart": {"python": True, "compiler": True, "variants_loaded": 0, "compiler_skipped": False},
    "compiler_process": {"python": sys.executable, "processes_started": 1, "deaths": 0},
    "threads_ms": {"app_main_wall": 1410.2, "app_main_cpu": 690.5, "compile_threads_cpu": 35.1, "prestart_cpu": 160.2,
                   "after_main": 0.4, "report": 0.2},
    "kernels": [{
        "name": AXPY, "demangled": "axpy_loop(int, int, float, float const*, float*)", "launches": 20000,
        "specialized_launches": 19984, "table_hits": 19982, "fallback_launches": 16, "launches_while_compiling": 10,
        "specializations": 2, "memory_cache_hits": 0, "disk_cache_hits": 0, "compile_ms": 31.5, "failures": {},
        "budget_refusals": 0, "kernel_time_vs_original": 0.81,
        "tracker": {"distinct_variants": 2, "stopped_folding": ["1"]},
        "variants": [{"source": "compiled", "launch": _launch(8)}, {"source": "compiled", "launch": _launch(9)}],
    }],
}


JOB_RANKS = 4


def rank_report(rank: int) -> dict:
    """RUN_REPORT as rank `rank` of a job with a shared tier writes it (PROTEUS_REPORT=run.%r.json):
    rank 0 compiled both variants, the others found them in the shared tier."""
    doc = json.loads(json.dumps(RUN_REPORT))
    kernel = doc["kernels"][0]
    for i, v in enumerate(kernel["variants"]):
        v["cache_key"] = f"{i + 1:064x}"
        v["source"] = "compiled" if rank == 0 else "shared"
    kernel["specializations"] = 2 if rank == 0 else 0
    doc.update(rank=rank, pid=4242 + rank, claims={"won": 2 if rank == 0 else 0, "lost": 0 if rank == 0 else 2,
                                                    "broken": 0, "wait_s": 0.0 if rank == 0 else 0.28,
                                                    "shared_hits": 0 if rank == 0 else 2, "write_failures": 0})
    return doc


@dataclass(frozen=True)
class Example:
    where: str    # the file and section
    section: str
    text: str     # as written: continuation lines joined, the comment dropped


@dataclass(frozen=True)
class Sample:
    where: str
    section: str
    lines: tuple[str, ...]
    commands: tuple[Example, ...]  # what printed it: its own `$ ` lines, else the section's last examples


def _fenced(path: Path):
    """(section, info string, lines) of each fenced block."""
    section, inside, info, body = "", False, "", []
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if inside:
                yield section, info, body
            inside, info, body = not inside, line[3:].strip(), []
        elif inside:
            body.append(line)
        elif line.startswith("#"):
            section = line.lstrip("#").strip()


def _commands(lines: list[str]) -> list[str]:
    out, current = [], []
    for line in lines:
        line = re.sub(r"\s+#\s.*$", "", line).rstrip()
        current.append(line.rstrip("\\"))
        if not line.endswith("\\"):
            out.append(" ".join(" ".join(current).split()))
            current = []
    return [c for c in out if c]


def _parse() -> tuple[list[Example], list[Sample]]:
    examples, samples = [], []
    for path, only in ((USAGE, None), (README, "Use")):
        last: dict[str, list[Example]] = {}
        for section, info, body in _fenced(path):
            if only and section != only:
                continue
            where = f"{path.relative_to(ROOT)}: {section}"
            if info == "sh":
                last[section] = [Example(where, section, c) for c in _commands(body)]
                examples += last[section]
            elif info == "" and not only:
                prompted, output, i = [], [], 0
                while i < len(body):
                    if body[i].startswith("$ "):
                        chunk = [body[i][2:]]
                        while chunk[-1].rstrip().endswith("\\") and i + 1 < len(body):
                            i += 1
                            chunk.append(body[i])
                        prompted += [Example(where, section, c) for c in _commands(chunk)]
                    else:
                        output.append(body[i])
                    i += 1
                examples += prompted
                samples.append(Sample(where, section, tuple(output), tuple(prompted or last.get(section, ()))))
    return examples, samples


EXAMPLES, SAMPLES = _parse()


def _split(text: str) -> tuple[list[str], list[str]]:
    """(env assignments, words) of an example."""
    words = shlex.split(text)
    env = []
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        env.append(words.pop(0))
    return env, words


def needs_gpu(text: str) -> bool:
    _, words = _split(text)
    return words[:1] != ["proteus-rewrite"] or words[1:2] == ["validate"] or "--validate" in words


def _optional_groups(text: str) -> tuple[str, str, list[str]]:
    """(the text without its top-level `[...]` groups, the text with them unbracketed, the groups)."""
    bare, full, groups, depth, group = [], [], [], 0, []
    for i, ch in enumerate(text):
        if ch == "[" and depth == 0 and (i == 0 or text[i - 1] == " "):
            depth, group = 1, []
            continue
        if depth:
            depth += {"[": 1, "]": -1}.get(ch, 0)
            if depth == 0:
                groups.append("".join(group))
                full.append(groups[-1])
            else:
                group.append(ch)
            continue
        bare.append(ch)
        full.append(ch)
    return " ".join("".join(bare).split()), " ".join("".join(full).split()), groups


def forms(text: str) -> list[str]:
    """The commands an example stands for."""
    if " | " in text:  # `cache ls | stats | clear`: each alternative in the last word's place
        first, *rest = text.split(" | ")
        stem = first.rsplit(" ", 1)[0]
        return [f for alt in (first, *(f"{stem} {r}" for r in rest)) for f in forms(alt)]
    bare, full, groups = _optional_groups(text)
    known = all(not re.search(r"[A-Z]", w) or w in PLACEHOLDERS for g in groups for w in g.split())
    return [bare, full] if groups and known else [bare]


def _app_paths(word: str, app: str) -> str:
    """./app, proteus-out/app/app.kstore, out/app with the sample's name (a path: "the app" stays)."""
    return re.sub(r"(?<![\w-])app(?![\w-])", app, word) if "/" in word else word


def _filled(word: str, app: str, command: str) -> str:
    if word in PLACEHOLDERS:
        return PLACEHOLDERS[word].format(app=app, command=command)
    assert not re.fullmatch(r"[A-Z][A-Z_]*", word), f"a placeholder this test does not know: {word}"
    word = _app_paths(word, app)
    return word.lstrip("/") if word.startswith("/") else word  # -o /opt/jit: inside the sample's directory


class Workspace:
    """A directory per section, holding its sample app as ./<app>; one JIT cache for all of them.
    Each command runs once: a sample output and its example share the run."""

    def __init__(self, root: Path, samples: Path):
        self.root, self.samples, self.runs = root, samples, {}
        self.env = {**os.environ, "PROTEUS_CACHE_DIR": str(root / "cache"),
                    "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.env.pop("PROTEUS_DEBUG", None)

    def run(self, section: str, form: str) -> subprocess.CompletedProcess:
        if (section, form) not in self.runs:
            self.runs[section, form] = self._run(section, form)
        return self.runs[section, form]

    def _run(self, section: str, form: str) -> subprocess.CompletedProcess:
        app = SAMPLE_OF_SECTION.get(section, DEFAULT_SAMPLE)
        cwd = self.root / re.sub(r"\W+", "-", section).strip("-")
        if not cwd.exists():
            cwd.mkdir()
            shutil.copy2(self.samples / app, cwd / app)
        env, words = _split(form)
        command = words[1] if len(words) > 1 and not words[1].startswith(("-", ".")) else "rewrite"
        args = [_filled(w, app, command) for w in words[1:]]
        if "--force" in args:  # as its comment says: APP is itself a rewritten executable
            args[args.index(f"./{app}")] = f"proteus-out/{app}/{app}"
        if any("proteus-out/" in a for a in args) and not (cwd / "proteus-out" / app).exists():
            done = self._cli(cwd, {}, [f"./{app}"])
            assert done.returncode == 0, done.stderr
        for a in args:
            name = os.path.basename(a)
            if name in LIBRARY_STAND_INS and not (cwd / a).exists():
                shutil.copy2(self.samples / LIBRARY_STAND_INS[name], cwd / a)
            if a.endswith(".json") and ("%r" in a or "*" in a):  # a job's reports (job-summary): one per rank
                for rank in range(JOB_RANKS):
                    (cwd / re.sub(r"%r|\*", str(rank), a)).write_text(json.dumps(rank_report(rank)))
            elif a.endswith(".json") and not (cwd / a).exists():
                (cwd / a).write_text(json.dumps(RUN_REPORT))
        return self._cli(cwd, dict(e.split("=", 1) for e in env), args)

    def _cli(self, cwd: Path, env: dict, args: list[str]) -> subprocess.CompletedProcess:
        code = "import sys; from proteus_rewrite.cli import run; sys.argv[0] = 'proteus-rewrite'; run()"
        return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env={**self.env, **env},
                              capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def workspace(samples, tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("usage"), samples)


def leading_words(line: str, app: str) -> str:
    """A sample output line's first words, up to one that differs from run to run."""
    words = []
    for w in line.split():
        if re.search(r"\d", w) or w.startswith(("/", "~")) or w == "...":
            if words:
                break
            continue
        words.append(_app_paths(w, app))
        if len(words) == 3:
            break
    return " ".join(words)


CPU_EXAMPLES = [e for e in EXAMPLES if not needs_gpu(e.text)]
CPU_SAMPLES = [s for s in SAMPLES if not all(needs_gpu(c.text) for c in s.commands)]


def test_the_docs_have_examples_and_samples():
    assert len(CPU_EXAMPLES) >= 15 and len(CPU_SAMPLES) >= 6, (CPU_EXAMPLES, CPU_SAMPLES)
    assert all(s.commands for s in SAMPLES), [s.where for s in SAMPLES if not s.commands]


def test_only_the_examples_that_run_the_app_are_left_to_the_gpu_tests():
    assert {e.text for e in EXAMPLES if needs_gpu(e.text)} == NEEDS_GPU
    # validate's sample output, whose command runs the app
    assert [s.section for s in SAMPLES if s not in CPU_SAMPLES] == ["Checking the variants: `validate`"]


@pytest.mark.parametrize("example", CPU_EXAMPLES, ids=lambda e: f"{e.where}: {e.text}")
def test_the_example_runs(example, workspace):
    for form in forms(example.text):
        proc = workspace.run(example.section, form)
        assert proc.returncode == 0, f"{example.where}: `{form}` exited {proc.returncode}: {proc.stderr}"


@pytest.mark.parametrize("sample", CPU_SAMPLES, ids=lambda s: f"{s.where}: {s.lines[0].strip()[:40]}")
def test_the_sample_output_has_the_shape_of_the_real_one(sample, workspace):
    app = SAMPLE_OF_SECTION.get(sample.section, DEFAULT_SAMPLE)
    printed = ""
    for example in sample.commands:
        for form in [] if needs_gpu(example.text) else forms(example.text):
            proc = workspace.run(example.section, form)
            assert proc.returncode == 0, f"`{form}`: {proc.stderr}"
            printed += proc.stdout + proc.stderr
    printed = " ".join(printed.split())
    missing = [line for line in sample.lines if (key := leading_words(line, app)) and key not in printed]
    assert not missing, f"{sample.where}: these lines begin unlike anything the commands printed: {missing}\n{printed[:3000]}"


def test_every_command_help_ends_with_examples_and_the_exit_codes():
    """usage.md: "Each command's `--help` lists its options and ends with examples and the exit codes"."""
    import click
    from click.testing import CliRunner

    from proteus_rewrite.cli import main

    def paths(group: click.Group, prefix: tuple[str, ...]):
        for name, cmd in group.commands.items():
            yield (*prefix, name)
            if isinstance(cmd, click.Group):
                yield from paths(cmd, (*prefix, name))

    lacking = []
    for path in [(), *paths(main, ())]:
        out = CliRunner().invoke(main, [*path, "--help"]).output
        if "Examples:" not in out or "Exit codes:" not in out:
            lacking.append(" ".join(path) or "(the group)")
    assert not lacking
