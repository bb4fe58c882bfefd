"""Upstream's CHECK and RUN lines for run.py: the part of FileCheck they use, the RUN lines' runs
under the tool (environment, verdicts, differences known to be expected, their report table),
and --recheck, which runs the real LLVM FileCheck on the outputs those runs saved.

Standard library only (Python 3.10+): this file travels to GPU hosts with run.py.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

# --- the part of FileCheck upstream's CHECK lines use ------------------------------------------

_PIECE = re.compile(r"\{\{(.*?)\}\}|\[\[(\w+)(?::(.*?))?\]\]")
UNBOUND = r"\S+"  # what a variable no checked line defines matches at its first use


def _literal(text: str) -> str:
    # FileCheck treats any run of blanks as one: "a  b" in the output matches "a b"
    return r"[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def check_regex(pattern: str, variables: dict[str, str]) -> tuple[re.Pattern, dict[str, str]]:
    """A FileCheck pattern as a regex: literal text, {{regex}}, [[VAR:regex]] definitions and
    [[VAR]] uses. A variable used but never defined (upstream defines some on trace lines, which
    are not always checked) is bound by its first use. Returns the regex and group -> variable."""
    out, groups, pos = [], {}, 0
    for m in _PIECE.finditer(pattern):
        out.append(_literal(pattern[pos:m.start()]))
        if m.group(1) is not None:
            out.append(f"(?:{m.group(1)})")
        elif m.group(3) is None and m.group(2) in variables:
            out.append(re.escape(variables[m.group(2)]))
        else:
            group = f"v{len(groups)}"
            groups[group] = m.group(2)
            out.append(f"(?P<{group}>{m.group(3) if m.group(3) is not None else UNBOUND})")
        pos = m.end()
    out.append(_literal(pattern[pos:]))
    return re.compile("".join(out)), groups


def _describe(c: dict) -> str:
    directive = {"CHECK": "", "COUNT": f"-COUNT-{c['count']}"}.get(c["directive"], "-" + c["directive"])
    return f"{c['prefix']}{directive}: {c['pattern']} (source line {c['line']})"


def first_failure(text: str, checks: list[dict]) -> tuple[dict, str] | None:
    """Check `text` against FileCheck directives (CHECK, NEXT, SAME, EMPTY, NOT, DAG, COUNT,
    LABEL), matching within lines as FileCheck does. Like FileCheck, it stops at the first
    directive that fails: returns it and why, or None when all pass."""
    lines = text.splitlines()
    variables: dict[str, str] = {}
    pos = (0, 0)  # (line, column) where the next match may start
    last = -1  # line of the previous match, for NEXT / SAME / EMPTY
    nots: list[tuple[dict, tuple[int, int]]] = []  # CHECK-NOTs waiting for the next match

    def search(c: dict, start: tuple[int, int], avoid: list[tuple[int, int, int]] = ()) -> tuple[int, int, int] | None:
        rx, groups = check_regex(c["pattern"], variables)
        for n in range(start[0], len(lines)):
            col = start[1] if n == start[0] else 0
            while (m := rx.search(lines[n], col)) is not None:
                if not any(a[0] == n and m.start() < a[2] and a[1] < m.end() for a in avoid):
                    variables.update({var: m.group(g) for g, var in groups.items()})
                    return n, m.start(), m.end()
                col = m.start() + 1  # DAG matches must not overlap one another
        return None

    def forbidden(until: tuple[int, int]) -> tuple[dict, str] | None:
        for c, start in nots:
            rx, _ = check_regex(c["pattern"], variables)
            for n in range(start[0], min(until[0] + 1, len(lines))):
                lo = start[1] if n == start[0] else 0
                hi = until[1] if n == until[0] else len(lines[n])
                if rx.search(lines[n][:hi], lo):
                    return c, f"{_describe(c)}: found on output line {n + 1}"
        nots.clear()
        return None

    i = 0
    while i < len(checks):
        c = checks[i]
        if c["directive"] == "NOT":
            nots.append((c, pos))
            i += 1
            continue
        if c["directive"] == "DAG":
            found: list[tuple[int, int, int]] = []
            while i < len(checks) and checks[i]["directive"] == "DAG":
                hit = search(checks[i], pos, found)
                if hit is None:
                    return checks[i], f"{_describe(checks[i])}: not found after output line {pos[0]}"
                found.append(hit)
                i += 1
            bad = forbidden(min((f[0], f[1]) for f in found))
            if bad:
                return bad
            pos = max((f[0], f[2]) for f in found)
            last = pos[0]
            continue
        if c["directive"] == "EMPTY":
            if last + 1 >= len(lines) or lines[last + 1].strip():
                return c, f"{_describe(c)}: output line {last + 2} is not empty"
            last += 1
            pos = (last + 1, 0)
            i += 1
            continue
        for _ in range(c["count"]):
            hit = search(c, pos)
            if hit is None:
                return c, f"{_describe(c)}: not found after output line {pos[0]}"
            if c["directive"] == "NEXT" and hit[0] != last + 1:
                return c, f"{_describe(c)}: on output line {hit[0] + 1}, not the one after line {last + 1}"
            if c["directive"] == "SAME" and hit[0] != last:
                return c, f"{_describe(c)}: on output line {hit[0] + 1}, not on line {last + 1}"
            bad = forbidden((hit[0], hit[1]))
            if bad:
                return bad
            pos, last = (hit[0], hit[2]), hit[0]
        i += 1
    return forbidden((len(lines), 0))


def filecheck(text: str, checks: list[dict]) -> list[str]:
    """first_failure's message as a list: empty when every directive passes."""
    failure = first_failure(text, checks)
    return [failure[1]] if failure else []


# --- CHECK lines that cannot hold under the tool, and why ----------------------------------------

# A failing directive matched here is labelled "expected: <reason>" in the report (never hidden).
# Each entry: "pattern" (a regex searched in the CHECK pattern) or "at" (upstream file -> its
# directives' line numbers), and a reason derived from reading code, not from a run.
KNOWN_DIFFERENCES: list[dict] = [
    {"pattern": r"^\[proteus\]\[JitEngineHost\]",
     "reason": "upstream's host-code JIT engine prints these; proteus-rewrite specializes device kernels "
               "only and prints no [proteus][JitEngineHost] line (proteus_rewrite/, shim/)"},
    {"pattern": r"^\[JITTestPass\]|,jit-test-pass$",
     "reason": "the JIT pass plugin comes from proteus::registerJITPassPlugin, a do-nothing link stub here "
               "(stubs/proteus_host_stubs.cpp), and upstream's JITTestPass plugin is not built"},
    {"pattern": r"^\[GVarInfo\]:",
     "reason": "upstream prints it from JitEngineDevice::insertGlobalVar, fed by the __proteus_register_var "
               "calls its compiler plugin inserts; proteus-rewrite prints no [GVarInfo] line (proteus_rewrite/, shim/)"},
    {"at": {"tests/gpu/kernel_host_jit.cpp": (37, 38)},
     "reason": "its device kernel has no annotate(\"jit\") (its host launcher has): upstream JITs annotated "
               "kernels only, this tool every kernel that carries bitcode, so its device cache is used once"},
    {"at": {"tests/gpu/kernels_gvar.cpp": (47, 50, 51)},
     "reason": "kernel3 has no annotate(\"jit\"): upstream JITs annotated kernels only, this tool every kernel "
               "that carries bitcode, so it counts 3 accesses (and, warm, 3 hits) where upstream counts 2"},
    {"at": {"tests/gpu/dim_spec_cache_test.cpp": (121, 122)},
     "reason": "upstream prints its in-memory entries in the order of its own hash values, which this tool does "
               "not compute (its HashValue stands in for them): the two entries come in the other order"},
    {"at": {"tests/gpu/enable_disable.cpp": (37, 38)},
     "reason": "proteus::enable/disable are do-nothing link stubs here (stubs/proteus_host_stubs.cpp): the tool "
               "cannot see that upstream runs the 2nd of 3 launches with the JIT off: its cache counts cover all 3"},
]


def known_reason(program: dict, check: dict) -> str | None:
    source = program.get("expected_output_source") or program.get("source")
    for known in KNOWN_DIFFERENCES:
        if "pattern" in known and re.search(known["pattern"], check["pattern"]):
            return known["reason"]
        if check["line"] in known.get("at", {}).get(source, ()):
            return known["reason"]
    return None


# --- upstream's RUN lines under the tool -------------------------------------------------------

CACHE_TOKEN = "%t.$$.proteus"  # lit: one directory per test file, shared by its RUN lines ($$: one shell)
_UNHANDLED = re.compile(r"%(?:[A-Za-z]|\{)")  # a lit substitution left after ours


def source_dir(program: dict, sources: Path) -> Path:
    """lit's %S: the folder of the test file, in the extracted upstream tree."""
    return sources / PurePosixPath(program.get("expected_output_source") or program["source"]).parent


def line_env(line: dict, cache_dir: Path, s_dir: Path) -> dict[str, str]:
    """A RUN line's environment with lit's substitutions made. PROTEUS_ASYNC_COMPILATION=0 unless
    the line says otherwise: upstream compiles synchronously by default, this tool does not."""
    env = {k: v.replace(CACHE_TOKEN, str(cache_dir)).replace("%S", str(s_dir)) for k, v in line.get("env", {}).items()}
    left = [f"{k}={v}" for k, v in env.items() if _UNHANDLED.search(v)]
    if left:
        raise ValueError(f"lit substitution not handled: {' '.join(left)}")
    env.setdefault("PROTEUS_ASYNC_COMPILATION", "0")
    # upstream's default cache is ./.proteus in the test's folder, one per test under lit; this
    # tool's is the user's cache directory (a documented difference), shared by every program
    env.setdefault("PROTEUS_CACHE_DIR", str(cache_dir.parent / "default.proteus"))
    return env


def missing_files(env: dict[str, str], s_dir: Path) -> list[str]:
    """Files a RUN line names under %S that are not there (the tarball must carry them)."""
    return [v for v in env.values() if v.startswith(str(s_dir) + "/") and not Path(v).exists()]


def prepare_cache(line: dict, cache_dir: Path) -> None:
    # lit's `rm -rf "%t.$$.proteus"` before the line; otherwise the earlier lines' cache stays
    if line.get("fresh_cache", True):
        shutil.rmtree(cache_dir, ignore_errors=True)


def line_checks(program: dict, line: dict) -> list[dict]:
    """Every directive of the line's prefixes, in file order, trace lines included (FileCheck's view)."""
    prefixes = set(line.get("check_prefixes") or ["CHECK"])
    return [c for c in program.get("checks", []) if c["prefix"] in prefixes]


def line_text(stdout: str, stderr: str, line: dict) -> str:
    # where upstream pipes 2>&1, FileCheck reads stderr too; here it comes after stdout
    return stdout + stderr if line.get("stderr_too") else stdout


def judge_line(program: dict, line: dict, text: str, rc: int | str, seconds: float, how: str = "") -> dict:
    """One RUN line's verdict: TIMEOUT, CRASH (lit's pipefail fails a nonzero exit), CHECK-FAILED
    or pass. A check failure is "expected" only when every failing directive is a known
    difference: the directives left after dropping those must all pass."""
    checks = line_checks(program, line)
    failure = first_failure(text, checks)
    res = {"verdict": "pass", "detail": "", "failing_line": None, "expected": None,
           "check_failure": failure[1] if failure else ""}
    if failure:
        res.update(verdict="CHECK-FAILED", detail=failure[1], failing_line=failure[0]["line"])
        reason = known_reason(program, failure[0])
        if reason:
            rest = first_failure(text, [c for c in checks if known_reason(program, c) is None])
            if rest is None:
                res["expected"] = reason
            else:  # a known difference first, an unexplained one behind it: report the latter
                res.update(detail=rest[1], failing_line=rest[0]["line"], also_known=reason)
    if rc == "timeout":
        res.update(verdict="TIMEOUT", detail=f"over {seconds} s", expected=None)
    elif rc != 0:
        res.update(verdict="CRASH", detail=how or f"exit {rc}", expected=None)
    return res


def line_record(n: int, line: dict, why: str = "") -> dict:
    """What the report says of RUN line n before it runs (NOT-RUN: `why`)."""
    return {"n": n, "line": line.get("line", ""), "check_prefixes": line.get("check_prefixes") or ["CHECK"],
            "upstream_env": line.get("env", {}), "stderr_too": bool(line.get("stderr_too")),
            "fresh_cache": bool(line.get("fresh_cache", True)), "verdict": "NOT-RUN", "detail": why,
            "failing_line": None, "expected": None}


def not_run(program: dict, why: str) -> list[dict]:
    return [line_record(n, line, why) for n, line in enumerate(program.get("runs", []), 1)]


def env_summary(run: dict) -> str:
    env = {k: v for k, v in run.get("upstream_env", {}).items() if k != "PROTEUS_CACHE_DIR"}
    words = [f"{k}={v}" for k, v in env.items()]
    if "PROTEUS_CACHE_DIR" in run.get("upstream_env", {}):
        words.append("(fresh cache)" if run.get("fresh_cache") else "(earlier lines' cache)")
    if run.get("stderr_too"):
        words.append("2>&1")
    return " ".join(words)


def verdict_cell(run: dict) -> str:
    return f"{run['verdict']} (expected: {run['expected']})" if run.get("expected") else run["verdict"]


def totals(results: list[dict]) -> dict[str, int]:
    runs = [r for p in results for r in p.get("upstream_runs", [])]
    count = {"total": len(runs), "pass": 0, "failed_expected": 0, "failed_unexplained": 0}
    for r in runs:
        key = "pass" if r["verdict"] == "pass" else "failed_expected" if r.get("expected") else "failed_unexplained"
        count[key] += 1
        if r["verdict"] != "pass":
            count[r["verdict"]] = count.get(r["verdict"], 0) + 1
    return count


def _cell(text: str, width: int = 200) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:width]


def markdown_runs(results: list[dict]) -> list[str]:
    """The report's section on upstream's RUN lines (empty when none ran, as with --native-only)."""
    if not any(p.get("upstream_runs") for p in results):
        return []
    t = totals(results)
    kinds = ", ".join(f"{k} {t[k]}" for k in ("CHECK-FAILED", "CRASH", "TIMEOUT", "NOT-RUN") if t.get(k))
    lines = ["", "## Upstream's RUN lines", "",
             "Each RUN line of upstream's test file, in order, under the tool with that line's environment "
             f"(`{CACHE_TOKEN}`: one cache folder per program, emptied where upstream's `rm -rf` precedes; `%S`: "
             "upstream's tests/gpu; PROTEUS_ASYNC_COMPILATION=0 unless set), checked against every directive "
             "of its prefixes, Proteus's trace lines included. Outputs: `upstream-runs/PROGRAM.N.txt`. "
             "`expected`: every failing directive is in KNOWN_DIFFERENCES (bench/corpora/upstream_tests/checks.py), for that reason.",
             "",
             f"RUN lines passing: {t['pass']}/{t['total']}; failing, expected: {t['failed_expected']}; "
             f"failing, unexplained: {t['failed_unexplained']}" + (f". Not passing, by verdict: {kinds}" if kinds else ""), "",
             "| program | RUN | env | verdict | first failing CHECK |", "|---|---|---|---|---|"]
    for p in results:
        for r in p.get("upstream_runs", []):
            detail = r.get("detail", "")
            if r["verdict"] in ("CRASH", "TIMEOUT") and r.get("check_failure"):
                detail += f"; {r['check_failure']}"  # lit would fail it either way: both said
            lines.append("| " + " | ".join([p["name"], str(r["n"]), _cell(env_summary(r), 160), _cell(verdict_cell(r), 260),
                                             _cell(detail, 300)]) + " |")
    return lines


# --- --recheck: the real FileCheck on the saved outputs ----------------------------------------

_FC_LINE = re.compile(r":(\d+):\d+: (?:error|note):")


def _first_error(stderr: str) -> str:
    return next((l.strip() for l in stderr.splitlines() if "error:" in l), (stderr.strip().splitlines() or [""])[0])


def run_filecheck(filecheck: str, source: Path, prefixes: list[str], text_file: Path,
                  extra: tuple[str, ...] = ()) -> dict:
    cmd = [filecheck, str(source), f"--check-prefixes={','.join(prefixes)}", f"--input-file={text_file}", *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"cmd": cmd, "rc": None, "pass": False, "error": str(exc), "source_line": None}
    # the directive's line: an error about a missing match points into the check file, one
    # about a CHECK-NOT match into the input, with a note pointing at the directive
    at = next((l for l in proc.stderr.splitlines() if l.startswith(f"{source}:")), "") if proc.returncode else ""
    m = _FC_LINE.match(at[len(str(source)):])
    return {"cmd": cmd, "rc": proc.returncode, "pass": proc.returncode == 0,
            "error": _first_error(proc.stderr) if proc.returncode else "",
            "source_line": int(m.group(1)) if m else None, "stderr_tail": proc.stderr[-2000:]}


_DEFINITION = re.compile(r"\[\[(\w+):(.*?)\]\]")


def _explained(filecheck: str, program: dict, source: Path, run: dict, text_file: Path, line_no: int | None) -> str | None:
    """The known difference that explains FileCheck's failure, if any: the first error is on a known
    directive, and FileCheck passes once every known directive of these prefixes is blanked out."""
    checks = line_checks(program, run)
    by_line = {c["line"]: c for c in checks}
    if line_no not in by_line or known_reason(program, by_line[line_no]) is None:
        return None
    known = {c["line"] for c in checks if known_reason(program, c)}
    text = source.read_text().splitlines()
    # A blanked directive may define a variable a kept one uses ([[SZ:[0-9]+]], then [[SZ]]):
    # the uses then match what the definition would have, as run.py's checker does.
    defined = {name: rx for n in known if n <= len(text) for name, rx in _DEFINITION.findall(text[n - 1])}
    blanked = []
    for n, line in enumerate(text, 1):  # keeps line numbers
        if n in known:
            line = "//"
        for name, rx in defined.items():
            line = line.replace(f"[[{name}]]", "{{" + rx + "}}")
        blanked.append(line)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / source.name
        copy.write_text("\n".join(blanked) + "\n")
        again = run_filecheck(filecheck, copy, run["check_prefixes"], text_file, ("--allow-unused-prefixes",))
    return known_reason(program, by_line[line_no]) if again["pass"] else None


def recheck(results_dir: Path, filecheck: str, sources: Path, programs: dict) -> int:
    """Run FileCheck on every saved RUN-line output that run.py's JSON lists; write
    upstream-filecheck.md and .json beside it. `programs`: programs.json (the directives, to tell
    known differences). Returns 1 when FileCheck cannot be run."""
    doc = json.loads((results_dir / "upstream-tests.json").read_text())
    described = {p["name"]: p for p in programs.get("programs", [])}
    version = ""
    try:
        out = subprocess.run([filecheck, "--version"], capture_output=True, text=True, timeout=60).stdout
        version = next((l.strip() for l in out.splitlines() if "version" in l.lower()), "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"cannot run {filecheck}: {exc}")
        return 1
    rows = []
    for program in doc.get("programs", []):
        source = sources / (program.get("expected_output_source") or program["source"])
        for run in program.get("upstream_runs", []):
            row = {"program": program["name"], "n": run["n"], "check_prefixes": run["check_prefixes"],
                   "run_verdict": run["verdict"], "builtin_pass": run.get("check_failure") == "",
                   "output_file": run.get("output_file")}
            text_file = results_dir / run["output_file"] if run.get("output_file") else None
            if text_file is None or not text_file.exists():
                row.update(filecheck="not-run", error="no saved output")
            elif not source.exists():
                row.update(filecheck="not-run", error=f"no source {source}")
            else:
                fc = run_filecheck(filecheck, source, run["check_prefixes"], text_file)
                row.update(filecheck="pass" if fc["pass"] else "FAIL", error=fc["error"].replace(f"{sources}/", ""),
                           source_line=fc["source_line"],
                           cmd=fc["cmd"], stderr_tail=fc.get("stderr_tail", ""))
                if not fc["pass"] and program["name"] in described:
                    row["expected"] = _explained(filecheck, described[program["name"]], source, run, text_file,
                                                 fc["source_line"])
                row["agrees_with_builtin"] = fc["pass"] == row["builtin_pass"]
            rows.append(row)
    header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "results": str(results_dir), "filecheck": filecheck, "filecheck_version": version, "sources": str(sources)}
    (results_dir / "upstream-filecheck.json").write_text(json.dumps({**header, "runs": rows}, indent=1) + "\n")
    (results_dir / "upstream-filecheck.md").write_text(recheck_markdown(header, rows))
    passed = sum(1 for r in rows if r["filecheck"] == "pass")
    print(f"FileCheck: {passed}/{len(rows)} RUN lines pass; wrote {results_dir / 'upstream-filecheck.md'}")
    return 0


def recheck_markdown(header: dict, rows: list[dict]) -> str:
    fails = [r for r in rows if r["filecheck"] == "FAIL"]
    expected = sum(1 for r in fails if r.get("expected"))
    lines = ["# Upstream's RUN lines, rechecked with LLVM FileCheck", "",
             *[f"- {k}: `{v}`" for k, v in header.items()], "",
             f"FileCheck passes: {sum(1 for r in rows if r['filecheck'] == 'pass')}/{len(rows)}; "
             f"failing, expected: {expected}; failing, unexplained: {len(fails) - expected}; "
             f"not run: {sum(1 for r in rows if r['filecheck'] == 'not-run')}; "
             f"disagreeing with run.py's checker: {sum(1 for r in rows if r.get('agrees_with_builtin') is False)}", "",
             "| program | RUN | prefixes | run verdict | FileCheck | first error |", "|---|---|---|---|---|---|"]
    for r in rows:
        verdict = r["filecheck"] + (f" (expected: {r['expected']})" if r.get("expected") else "")
        if r.get("agrees_with_builtin") is False:
            verdict += " (run.py's checker disagrees)"
        lines.append("| " + " | ".join([r["program"], str(r["n"]), ",".join(r["check_prefixes"]), r["run_verdict"],
                                         _cell(verdict, 260), _cell(r.get("error", ""))]) + " |")
    return "\n".join(lines) + "\n"
