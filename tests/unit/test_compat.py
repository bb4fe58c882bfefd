"""Compatibility with upstream Proteus: its tuned-kernel file and variables (jit/config.py), and
its trace lines (compat.py) checked against the FileCheck lines of upstream's own GPU tests
(tests/data/upstream/, copied verbatim; see the README there)."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proteus_rewrite import compat
from proteus_rewrite.errors import SpecializeError
from proteus_rewrite.jit.config import CodegenConfig, Config

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
SREG = "llvm.nvvm.read.ptx.sreg."

# ---------------------------------------------------------------- a small FileCheck


@dataclass(frozen=True)
class Directive:
    kind: str  # CHECK, NEXT, NOT, COUNT
    count: int
    regex: re.Pattern
    text: str
    line: int


_SUFFIX = r"(-NEXT|-NOT|-DAG|-SAME|-EMPTY|-LABEL|-COUNT-(\d+))?:"


def _pattern(text: str) -> re.Pattern:
    """FileCheck's pattern syntax: literal text with {{regex}} parts; a run of blanks matches
    any run of blanks (FileCheck canonicalizes horizontal whitespace)."""
    out = []
    for i, part in enumerate(re.split(r"\{\{(.*?)\}\}", text.strip())):
        if i % 2:
            out.append(f"(?:{part})")
        else:
            out.extend(r"[ \t]+" if re.fullmatch(r"[ \t]+", piece) else re.escape(piece)
                       for piece in re.split(r"([ \t]+)", part) if piece)
    return re.compile("".join(out))


def directives(source: str, prefixes: tuple[str, ...]) -> list[Directive]:
    found = []
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    directive = re.compile(rf"(?<![\w-])({alternatives}){_SUFFIX}(.*)$")
    for n, line in enumerate(source.splitlines(), 1):
        m = directive.search(line)
        if not m:
            continue
        suffix, count, text = m.group(2) or "", m.group(3), m.group(4)
        if suffix in ("-DAG", "-SAME", "-EMPTY", "-LABEL"):
            raise NotImplementedError(f"line {n}: {suffix[1:]} is not supported by this FileCheck")
        kind = {"": "CHECK", "-NEXT": "NEXT", "-NOT": "NOT"}.get(suffix, "COUNT")
        found.append(Directive(kind, int(count or 1), _pattern(text), text.strip(), n))
    return found


def filecheck(output: str, source: str, prefixes: tuple[str, ...]) -> None:
    """Raise AssertionError where `output` fails the CHECK lines of `source` for `prefixes`."""
    pos, nots = 0, []
    checks = directives(source, prefixes)
    assert checks, f"no directives for {prefixes}"
    for d in checks:
        if d.kind == "NOT":
            nots.append(d)
            continue
        for _ in range(d.count):
            m = d.regex.search(output, pos)
            assert m, f"line {d.line}: {d.text!r} not found after:\n{output[pos:pos + 400]}"
            for n in nots:
                bad = n.regex.search(output, pos, m.start())
                assert not bad, f"line {n.line}: CHECK-NOT {n.text!r} found: {bad.group(0)!r}"
            if d.kind == "NEXT":
                assert output.count("\n", pos, m.start()) == 1, f"line {d.line}: {d.text!r} is not on the next line"
            nots, pos = [], m.end()
    for n in nots:
        bad = n.regex.search(output, pos)
        assert not bad, f"line {n.line}: CHECK-NOT {n.text!r} found: {bad.group(0)!r}"


def test_the_filecheck_matches_like_filecheck():
    src = "// CHECK: a {{[0-9]+}} b\n// CHECK-NEXT: c\n// CHECK-NOT: x\n// CHECK-COUNT-2: d\n// CHECK-OTHER: zzz\n"
    filecheck("a 12   b\nc\nd\nd\n", src, ("CHECK",))
    for bad in ("a b\nc\nd\nd\n", "a 1 b\n\nc\nd\nd\n", "a 1 b\nc\nx\nd\nd\n", "a 1 b\nc\nd\n"):
        with pytest.raises(AssertionError):
            filecheck(bad, src, ("CHECK",))
    with pytest.raises(AssertionError):
        filecheck("", src, ("CHECK-OTHER",))


# ---------------------------------------------------------------- upstream's run, as our lines render it


@dataclass(frozen=True)
class Launch:
    kernel: str  # symbol
    demangled: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: dict = field(default_factory=dict)  # annotated argument number -> (LLVM type, value)
    calls: dict = field(default_factory=dict)  # sreg intrinsic -> call sites in the kernel
    prints: tuple[str, ...] = ()  # what the kernel prints


def run(program: list, env: dict[str, str], stored: set) -> str:
    """Upstream's stdout for `program` (Launch or a line the host prints), rendered with
    compat's lines in upstream's order (JitEngineDevice: memory cache, storage cache, compile).
    `stored`: the on-disk cache's keys, carried from one run to the next."""
    cfg = Config.from_env(env)
    traced, out = "specialization" in cfg.trace, []
    if traced and cfg.use_stored_cache:
        out += compat.cache_chain_setup_lines()
    memory: dict[str, list[int]] = {}  # key -> [launches, hits]
    order: list[tuple[str, str]] = []
    storage = [0, 0]
    for step in program:
        if isinstance(step, str):
            out.append(step)
            continue
        key = hashlib.sha256(repr((step.kernel, sorted(step.args.items()), step.grid, step.block)).encode()).hexdigest()
        if key in memory:
            memory[key][0] += 1
            memory[key][1] += 1
        else:
            memory[key] = [1, 0]
            order.append((key, step))
            storage[1] += 1
            if key in stored:
                storage[0] += 1
                if traced:
                    out.append(compat.cache_hit_line(compat.hash_value(key)))
            else:
                stored.add(key)
                if traced:
                    out += compile_trace(step, cfg.for_kernel(step.kernel, step.demangled))
        out += step.prints
    hits, accesses = sum(h for _, h in memory.values()), sum(n for n, _ in memory.values())
    if "cache-stats" in cfg.trace:
        out += compat.memory_cache_lines(hits, accesses, [(compat.hash_value(k), *memory[k]) for k, _ in order])
    if "kernel-trace" in cfg.trace:
        per: dict[str, list[int]] = {}
        for k, step in order:
            per.setdefault(step.demangled, [0, 0])
            per[step.demangled][0] += 1
            per[step.demangled][1] += memory[k][0]
        out += compat.kernel_trace_lines((name, n, launches) for name, (n, launches) in per.items())
    if "cache-stats" in cfg.trace and cfg.use_stored_cache:
        out += compat.cache_chain_lines(*storage)
    return "\n".join(out) + "\n"


def compile_trace(step: Launch, cg: CodegenConfig) -> list[str]:
    """CompilationTask: [KernelConfig], then specializeIR's lines, then the pipeline's."""
    lines = [compat.kernel_config_line(step.kernel, cg)]
    if cg.specialize_args:
        lines += compat.arg_spec_lines(step.kernel, {i: v for i, (_, v) in step.args.items()},
                                       {i: t for i, (t, _) in step.args.items()})
    if cg.specialize_dims:
        lines += compat.dim_spec_lines(step.grid, step.block, step.calls)
    if cg.specialize_dims_range:
        lines += compat.dim_range_lines(step.grid, step.block, step.calls)
    if cg.specialize_launch_bounds:
        threads = step.block[0] * step.block[1] * step.block[2]
        lines.append(compat.launch_bound_line(threads, compat.upstream_min_blocks(cg.tuned_max_threads,
                                                                                  cg.min_blocks_per_sm, threads)))
    if cg.opt_pipeline is not None:
        lines.append(compat.custom_pipeline_line(cg.opt_pipeline))
    return lines


def check_runs(name: str, program: list, runs: list[tuple[dict, tuple[str, ...]]]) -> None:
    source, stored = (UPSTREAM / name).read_text(), set()
    for env, prefixes in runs:
        filecheck(run(program, env, stored), source, prefixes)


ONE = (1, 1, 1)
FIRST = ({"PROTEUS_CACHE_DIR": "/tmp/x", "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}, ("CHECK", "CHECK-FIRST"))
SECOND = ({"PROTEUS_CACHE_DIR": "/tmp/x", "PROTEUS_TRACE_OUTPUT": "cache-stats"}, ("CHECK", "CHECK-SECOND"))


def test_kernel_args_trace_matches_upstream():
    k = Launch("_Z6kerneliii", "kernel(int, int, int)", ONE, ONE, {0: ("i32", 3), 1: ("i32", 2), 2: ("i32", 1)},
               prints=("Kernel arg 6",))
    check_runs("kernel_args.cpp", [k], [FIRST, SECOND])


def test_types_trace_matches_upstream():
    """Every scalar type's value as LLVM prints it: i1 true, i8 97, float/double 1.000000e+00."""
    cases = [("i", "i32", 1), ("l", "i64", 1), ("j", "i32", 1), ("m", "i64", 1), ("x", "i64", 1), ("y", "i64", 1),
             ("f", "float", 1.0), ("d", "double", 1.0), ("b", "i1", True), ("c", "i8", 97), ("h", "i8", 97)]
    program = [Launch(f"_Z6kernelI{c}EvT_", f"void kernel<{c}>({c})", ONE, ONE, {0: (t, v)}) for c, t, v in cases]
    check_runs("types.cpp", program, [FIRST, SECOND])


def test_daxpy_trace_matches_upstream():
    """annotate("jit", 4): only N; dimension ranges on (PROTEUS_SPECIALIZE_DIMS_RANGE=1)."""
    daxpy = Launch("_Z9daxpyImpldPdS_m", "daxpyImpl(double, double*, double*, unsigned long)", (4, 1, 1), (256, 1, 1),
                   {3: ("i64", 1024)}, {SREG + "tid.x": 1, SREG + "ctaid.x": 1})
    first, second = ({**env, "PROTEUS_SPECIALIZE_DIMS_RANGE": "1"} for env, _ in (FIRST, SECOND))
    check_runs("daxpy.cpp", ["0", daxpy, "19944.1", daxpy, "39888.2"],
               [(first, ("CHECK", "CHECK-FIRST")), (second, ("CHECK", "CHECK-SECOND"))])


def test_block_grid_dims_trace_matches_upstream():
    every = {SREG + f"{reg}.{axis}": 1 for reg in ("nctaid", "ntid", "tid", "ctaid") for axis in "xyz"}
    program = []
    for tid in (4, 8, 16, 32, 64):
        g = tid // 4
        program.append(Launch("_Z6kernelv", "kernel()", (1, 1, g), (1, 1, tid), calls=every,
                              prints=(f"ThreadId: (0 0 {tid - 1}) BlockID: (0 0 {g - 1}) BlockDim: (1 1 {tid}) "
                                      f"GridDim: (1 1 {g})",)))
    first, second = ({**env, "PROTEUS_SPECIALIZE_DIMS_RANGE": "1"} for env, _ in (FIRST, SECOND))
    check_runs("block_grid_dim_3d.cpp", program, [(first, ("CHECK", "CHECK-FIRST")), (second, ("CHECK", "CHECK-SECOND"))])


def test_kernel_trace_summary_matches_upstream():
    env = {"PROTEUS_CACHE_DIR": "/tmp/x", "PROTEUS_TRACE_OUTPUT": "kernel-trace;cache-stats"}
    k = Launch("_Z6kernelv", "kernel()", ONE, ONE, prints=("Kernel",))
    check_runs("kernel.cpp", [k], [(env, ("CHECK", "CHECK-FIRST")), (env, ("CHECK", "CHECK-SECOND"))])


def test_kernel_cache_and_chain_lines_match_upstream():
    k = Launch("_Z6kernelv", "kernel()", ONE, ONE, prints=("Kernel",))
    env = {"PROTEUS_CACHE_DIR": "/tmp/x", "PROTEUS_TRACE_OUTPUT": "cache-stats"}
    config = {"PROTEUS_OBJECT_CACHE_CHAIN": "storage", "PROTEUS_CACHE_DIR": "/tmp/x",
              "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}
    check_runs("kernel_cache.cpp", [k] * 10, [(env, ("CHECK", "CHECK-FIRST")), (env, ("CHECK", "CHECK-SECOND"))])
    check_runs("kernel_cache.cpp", [k] * 10, [(config, ("CHECK-CONFIG",))])
    assert Config.from_env(config).notes == ()  # storage is what this tool's cache is: nothing to say


def test_upstream_tuned_config_file_is_read_as_upstream_reads_it():
    """Upstream's own tests/gpu/tuned_config.json (it was refused whole before: "unknown key
    'CodeGen'"), and the [KernelConfig] lines upstream's kernel_tuning.cpp expects from it."""
    env = {"PROTEUS_TUNED_KERNELS": str(UPSTREAM / "tuned_config.json"), "PROTEUS_TRACE_OUTPUT": "specialization;cache-stats"}
    cfg = Config.from_env(env)
    assert set(cfg.tuned) == {"foo", "bar"}
    foo, bar = cfg.tuned["foo"], cfg.tuned["bar"]
    # "OptLevel": 1 is a number where upstream reads a string: upstream keeps its default, 3.
    assert (foo.opt_level, foo.codegen_opt_level, foo.opt_pipeline) == ("3", 2, "default<O3>,globaldce")
    assert (foo.specialize_launch_bounds, foo.specialize_dims, foo.tuned_max_threads, foo.min_blocks_per_sm) == (False, False, 1, 4)
    assert (bar.specialize_dims_range, bar.tuned_max_threads, bar.min_blocks_per_sm) == (True, 4, 4)
    assert cfg.for_kernel("baz") == cfg.codegen
    assert any("'foo': CodeGen \"serial\" has no effect here" in n for n in cfg.notes)
    assert any("'bar': OptLevel 1 is not a JSON string" in n and 'write "1"' in n for n in cfg.notes)
    assert len(cfg.notes) == len(set(cfg.notes)) == 3
    foo_k = Launch("foo", "foo", ONE, ONE, prints=("Hello from foo",))
    bar_calls = {SREG + "tid.x": 1, SREG + "ctaid.x": 1, SREG + "ntid.x": 1}
    bar1 = Launch("bar", "bar", ONE, ONE, calls=bar_calls, prints=("Hello from bar",))
    bar4 = Launch("bar", "bar", ONE, (4, 1, 1), calls=bar_calls, prints=("Hello from bar",))
    baz = Launch("baz", "baz", ONE, ONE, prints=("Hello from baz",))
    check_runs("kernel_tuning.cpp", [foo_k, bar1, bar4, baz], [(env, ("CHECK", "CHECK-CUDA"))])


def test_a_wrong_line_fails_the_upstream_checks():
    wrong = Launch("_Z6kerneliii", "kernel(int, int, int)", ONE, ONE, {0: ("i32", 3), 1: ("i64", 2), 2: ("i32", 1)},
                   prints=("Kernel arg 6",))
    with pytest.raises(AssertionError, match="ArgNo 1 with value i32 2"):
        check_runs("kernel_args.cpp", [wrong], [FIRST])


# ---------------------------------------------------------------- values as LLVM prints them


@pytest.mark.parametrize("llvm_type, value, text", [
    ("i32", 42, "i32 42"), ("i32", 0xFFFFFFFF, "i32 -1"), ("i64", 1024, "i64 1024"), ("i8", 97, "i8 97"),
    ("i1", True, "i1 true"), ("i1", 0, "i1 false"), ("double", 1.0, "double 1.000000e+00"),
    ("double", 3.14, "double 3.140000e+00"), ("double", 6.2, "double 6.200000e+00"), ("double", 0.1, "double 1.000000e-01"),
    ("double", 3.14159265, "double 0x400921FB53C8D4F1"), ("double", -0.0, "double -0.000000e+00"),
    ("double", 1e100, "double 1.000000e+100"), ("double", float("inf"), "double 0x7FF0000000000000"),
    ("float", 1.0, "float 1.000000e+00"), ("float", struct.unpack("<f", struct.pack("<f", 0.1))[0], "float 0x3FB99999A0000000"),
    ("half", 1.0, "half 0xH3C00"), ("bfloat", 1.0, "bfloat 0xR3F80"), ("ptr", 0, "ptr null"),
    ("ptr", 4096, "ptr inttoptr (i64 4096 to ptr)"), ("float", b"\x01\x00\xc0\x7f", "float 0x7FF8000020000000"),
])
def test_llvm_constant_text(llvm_type, value, text):
    assert compat.llvm_constant(llvm_type, value) == text


@pytest.mark.parametrize("bits", [0x3FF0000000000000, 0x3FB999999999999A, 0x400921FB54442D18, 0x4018CCCCCCCCCCCD,
                                  0xC05EDD2F1A9FBE77, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF, 0x3E112E0BE826D695,
                                  0x412E848000000000, 0x8000000000000000])
def test_fp_text_is_llvms_own(bits):
    """What LLVM's AsmWriter itself prints (through llvmlite), for doubles and the floats they round to."""
    llvm = pytest.importorskip("llvmlite.binding")
    d = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    f = struct.unpack("<f", struct.pack("<f", d))[0] if abs(d) < 3e38 else 1.0
    fbits = struct.unpack("<Q", struct.pack("<d", f))[0]
    module = str(llvm.parse_assembly(f"@d = global double 0x{bits:016X}\n@f = global float 0x{fbits:016X}\n"))
    assert f"@d = global {compat.llvm_constant('double', d)}\n" in module
    assert f"@f = global {compat.llvm_constant('float', f)}\n" in module


def test_other_lines():
    cg = CodegenConfig()
    assert compat.kernel_config_line("baz", cg) == "[KernelConfig] ID:baz CG:RTC SA:1 LB:1 SD:1 SDR:0 OL:3 CGL:3 TMT:-1 BPSM:0 "
    assert compat.timer_line("specializeIR", 12.9) == "[proteus] specializeIR 12 ms"
    assert compat.optimize_timer_line("3", None, 3, 40) == "[proteus] optimizeIR optlevel 3 codegenopt 3 40 ms"
    assert compat.kernel_trace_lines([]) == []
    assert compat.distributed_rank({"SLURM_PROCID": "3"}) == "3" and compat.distributed_rank({}) == "0"
    assert compat.sreg_calls("%1 = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n%2 = tail call noundef i32 "
                             "@llvm.nvvm.read.ptx.sreg.tid.x() #3\n") == {SREG + "tid.x": 2}
    assert compat.upstream_min_blocks(4, 4, 4) == 4 and compat.upstream_min_blocks(4, 4, 1) == 0
    trace = compat.chrome_trace([compat.TraceEvent("proteus::specializeIR", 10, 900), compat.TraceEvent("tiny", 0, 3)],
                                grain_us=500, pid=7, begin_us=1)
    names = [e["name"] for e in trace["traceEvents"]]
    assert names == ["proteus::specializeIR", "Total proteus::specializeIR", "process_name"]
    json.dumps(trace)


# ---------------------------------------------------------------- tuned file: never dropped whole


def _tuned(tmp_path, doc, **env) -> Config:
    path = tmp_path / "tuned.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return Config.from_env({"PROTEUS_TUNED_KERNELS": str(path), **env})


def test_a_bad_key_or_value_skips_only_itself(tmp_path):
    cfg = _tuned(tmp_path, {
        "k1": {"SpecializeArgs": False, "Frobnicate": 1, "OptLevel": "O2", "CodeGenOptLevel": 7},
        "k2": {"LaunchBounds": 0, "CodeGen": "fast", "Pipeline": "default<O1>", "TunedMaxThreads": "128"},
        "k3": ["not", "an", "object"],
        "k4": {"OptLevel": "2", "CodeGenOptLevel": 1.0, "MinBlocksPerSM": 0, "TunedMaxThreads": -1, "CapRegisters": False},
    })
    assert set(cfg.tuned) == {"k1", "k2", "k4"}
    assert cfg.tuned["k1"] == CodegenConfig(specialize_args=False)
    assert cfg.tuned["k2"] == CodegenConfig(opt_pipeline="default<O1>")
    assert cfg.tuned["k4"] == CodegenConfig(opt_level="2", codegen_opt_level=1, cap_registers=False)
    text = "\n".join(cfg.notes)
    for expected in ("'k1': unknown key 'Frobnicate' ignored", "'k1': OptLevel \"O2\": upstream reads only its first character",
                     "'k1': CodeGenOptLevel 7: expected 0 to 3", "'k2': LaunchBounds 0 is not a JSON boolean", "write false",
                     "'k2': CodeGen \"fast\": not rtc, serial or parallel", "'k2': TunedMaxThreads \"128\" is not a JSON integer",
                     "write 128", "'k3': not an object: skipped"):
        assert expected in text
    assert len(cfg.notes) == 7


def test_tuned_entries_take_upstream_defaults_not_the_environments(tmp_path):
    cfg = _tuned(tmp_path, {"k": {"SpecializeDims": False}}, PROTEUS_SPECIALIZE_ARGS="0", PROTEUS_OPT_LEVEL="2",
                 PROTEUS_PTX_COMPILER="ptxas")
    assert cfg.codegen.specialize_args is False and cfg.codegen.opt_level == "2"
    assert cfg.tuned["k"] == CodegenConfig(specialize_dims=False, ptx_compiler="ptxas")  # ours: from the environment


@pytest.mark.parametrize("doc, message", [("{not json", "not JSON"), ("[1, 2]", "top level must be an object")])
def test_an_unreadable_tuned_file_is_still_an_error(tmp_path, doc, message):
    with pytest.raises(SpecializeError, match=message):
        _tuned(tmp_path, doc)


# ---------------------------------------------------------------- the environment


def test_upstream_variables_with_no_meaning_here_are_noted_once_each():
    quiet = {"PROTEUS_KERNEL_CLONE": "cross-clone", "PROTEUS_CODEGEN": "RTC", "PROTEUS_OBJECT_CACHE_CHAIN": "storage",
             "PROTEUS_RELINK_GLOBALS_BY_COPY": "0", "PROTEUS_DEBUG_OUTPUT": "0", "PROTEUS_ASYNC_TEST_BLOCKING": "0",
             "PROTEUS_COMM_THREAD_POLL_MS": "25"}
    assert Config.from_env(quiet).notes == ()
    loud = {"PROTEUS_KERNEL_CLONE": "link-clone-prune", "PROTEUS_CODEGEN": "serial",
            "PROTEUS_OBJECT_CACHE_CHAIN": "mpi-local-lookup,storage", "PROTEUS_RELINK_GLOBALS_BY_COPY": "1",
            "PROTEUS_DEBUG_OUTPUT": "1", "PROTEUS_ASYNC_TEST_BLOCKING": "1", "PROTEUS_COMM_THREAD_POLL_MS": "5",
            "PROTEUS_CLANGXX_BIN": "/usr/bin/clang++", "PROTEUS_ENABLE_HIP": "1"}
    notes = Config.from_env(loud).notes
    assert len(notes) == len(loud)
    for name in loud:
        assert sum(n.startswith(name) for n in notes) == 1, name
    assert all("\n" not in n for n in notes)


def test_every_upstream_and_own_variable_is_known():
    """No typo warning for a name upstream or this tool reads (the shim and the package included)."""
    root = Path(__file__).resolve().parents[2]
    names = set()
    for path in (root / "proteus_rewrite").rglob("*.py"):  # names in string literals (C macros are not)
        names |= set(re.findall(r"[\"'](PROTEUS_[A-Z0-9_]+)[\"']", path.read_text()))
    for path in (root / "shim").glob("*.c"):
        names |= set(re.findall(r'getenv\("(PROTEUS_[A-Z0-9_]+)"\)', path.read_text()))
    assert {"PROTEUS_DISABLE", "PROTEUS_PRESTART", "PROTEUS_TRACKER_RATIO"} <= names
    assert not names - compat.KNOWN_ENV
    assert Config.from_env(dict.fromkeys(sorted(compat.KNOWN_ENV - compat.UPSTREAM_BUILD_OPTIONS), "")).notes == ()


def test_a_misspelt_variable_is_noted_with_a_suggestion():
    (note,) = Config.from_env({"PROTEUS_SPECIALISE_ARGS": "0"}).notes
    assert "PROTEUS_SPECIALISE_ARGS is not a variable" in note and "did you mean PROTEUS_SPECIALIZE_ARGS" in note


def test_trace_tokens_timers_and_time_trace():
    cfg = Config.from_env({"PROTEUS_TRACE_OUTPUT": "specialization;cache-stats;kernel-trace;ir-dump;bogus;",
                           "PROTEUS_ENABLE_TIMERS": "1", "PROTEUS_ENABLE_TIME_TRACE": "1", "PROTEUS_TIME_TRACE_GRAIN": "100"})
    assert cfg.trace == frozenset(compat.UPSTREAM_TRACE_TOKENS)
    assert cfg.notes == ("PROTEUS_TRACE_OUTPUT: unknown token 'bogus' ignored (known: specialization, ir-dump, "
                         "kernel-trace, cache-stats, variants, launches)",)
    assert (cfg.enable_timers, cfg.enable_time_trace, cfg.time_trace_grain_us, cfg.time_trace_path) == (True, True, 100, "out.time-trace")
    default = Config.from_env({})
    assert (default.enable_timers, default.enable_time_trace, default.time_trace_file,
            default.time_trace_grain_us) == (False, False, "", 500)
    soft = Config.from_env({"PROTEUS_ENABLE_TIMERS": "yes please", "PROTEUS_TIME_TRACE_GRAIN": "0",
                            "PROTEUS_TIME_TRACE_FILE": "t.json"})
    assert (soft.enable_timers, soft.time_trace_grain_us, soft.time_trace_path) == (False, 500, "t.json") and len(soft.notes) == 2


@pytest.mark.parametrize("raw, value", [("1", True), ("0", False), ("2", True), (" true ", True), ("off", False)])
def test_switches_take_upstreams_integers_and_words(raw, value):
    assert Config.from_env({"PROTEUS_SPECIALIZE_DIMS": raw}).codegen.specialize_dims is value
