"""JIT configuration from PROTEUS_* environment variables, with upstream Proteus's names,
syntax and defaults (docs: README, "Configuration"; upstream's table and what each of its
variables does here: proteus_rewrite/compat.py).

Per-kernel settings come from PROTEUS_TUNED_KERNELS, a JSON file {kernel: {Pipeline, CodeGen,
SpecializeArgs, LaunchBounds, SpecializeDims, SpecializeDimsRange, OptLevel, CodeGenOptLevel,
TunedMaxThreads, MinBlocksPerSM}} read as upstream reads it: Pipeline, CodeGen and OptLevel are
strings, the four switches JSON booleans, the rest integers; a key left out takes upstream's
default, not the environment's (an entry is the kernel's whole configuration). A kernel is named
by its mangled or demangled name. Unlike upstream, a bad key or value never stops anything: it is
skipped, the rest of the file kept, and a one-line note says why.

Notes (`Config.notes`) are one-line messages for settings that do nothing here or were
skipped; the run time prints each once. Values that change the generated code or the cache
(PROTEUS_OPT_LEVEL=4, PROTEUS_SPECIALIZE_ARGS=maybe, an unreadable tuned file) still raise
ConfigError (a SpecializeError), as upstream stops on them too: guessing would compile and cache code the user
did not ask for, and the run time then runs the app unspecialized with one error line. Values of
the diagnostic switches (traces, timers) are noted and fall back to the default instead.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import compat
from ..errors import ConfigError

OPT_LEVELS = ("0", "1", "2", "3", "s", "z")
ASYNC_MODES = ("0", "1", "auto")
PTX_COMPILERS = ("auto", "nvjitlink", "ptxas", "driver")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(raw: str) -> bool | None:
    text = raw.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    try:
        return int(text) != 0  # upstream: static_cast<bool>(std::stoi(value)), so 2 is on
    except ValueError:
        return None


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = _parse_bool(raw)
    if value is None:
        raise ConfigError(f"{name}={raw!r}: expected 0 or 1")
    return value


def _soft_bool(env: Mapping[str, str], name: str, default: bool, notes: list[str]) -> bool:
    """A diagnostic switch: a bad value is noted and the default kept."""
    raw = env.get(name)
    value = None if raw is None or raw == "" else _parse_bool(raw)
    if raw and raw.strip() and value is None:
        notes.append(f"{name}={raw!r}: expected 0 or 1; using {int(default)}")
    return default if value is None else value


DEFAULT_SKIPPED = ("indvars",)


@dataclass(frozen=True)
class CodegenConfig:
    """Everything that changes the generated code (and so goes into the cache key)."""

    specialize_args: bool = True  # PROTEUS_SPECIALIZE_ARGS
    specialize_launch_bounds: bool = True  # PROTEUS_SPECIALIZE_LAUNCH_BOUNDS
    specialize_dims: bool = True  # PROTEUS_SPECIALIZE_DIMS
    specialize_dims_range: bool = False  # PROTEUS_SPECIALIZE_DIMS_RANGE (off on CUDA, as upstream)
    specialize_alignment: bool = False  # PROTEUS_SPECIALIZE_ALIGNMENT (ours; off until measured to help)
    opt_level: str = "3"  # PROTEUS_OPT_LEVEL
    codegen_opt_level: int = 3  # PROTEUS_CODEGEN_OPT_LEVEL
    opt_pipeline: str | None = None  # PROTEUS_OPT_PIPELINE (textual new-PM pipeline)
    ptx_compiler: str = "auto"  # PROTEUS_PTX_COMPILER (ours): auto | nvjitlink | ptxas | driver
    tuned_max_threads: int | None = None  # TunedMaxThreads from PROTEUS_TUNED_KERNELS
    min_blocks_per_sm: int | None = None  # MinBlocksPerSM, applied only when the block size is TunedMaxThreads
    cap_registers: bool = True  # PROTEUS_CAP_REGISTERS (ours): at most the registers that keep the AOT code's occupancy
    occupancy_step: bool = True  # PROTEUS_OCCUPANCY_STEP (ours): try one more block per SM (targets.step_occupancy)
    # PROTEUS_PTX_FOLD_FLOATS (ours, off): fold float and double arguments on the PTX route too,
    # behind the passes that keep ptxas's constant arithmetic to what the AOT code executed
    # (jit/ptx_contract.py); off until outputs over the corpora show it changes none
    ptx_fold_floats: bool = False
    # PROTEUS_SKIP_PASSES (ours): passes of LLVM's pipeline not run. LLVM 22's IndVarSimplify
    # raises register pressure past LLVM 19's (docs/dev/findings/registers.md).
    skip_passes: tuple[str, ...] = DEFAULT_SKIPPED
    # PROTEUS_UNROLL_THRESHOLD (ours): LLVM's -unroll-threshold for the whole process (None:
    # LLVM's own, 300 at O3). rsbench's variant keeps two loops that nvcc unrolls
    # (docs/dev/findings/codegen.md); unmeasured on the GPU, so not a default.
    unroll_threshold: int | None = None

    def key_fields(self) -> dict:
        return dict(_key_fields(self))


@functools.lru_cache(maxsize=64)
def _key_fields(cg: CodegenConfig) -> tuple:
    # asdict was half of a cache lookup's 0.16 ms, paid by every miss (the shim asks the caches
    # on the launching thread before it queues a compilation); a configuration is frozen.
    return tuple(dataclasses.asdict(cg).items())


@dataclass(frozen=True)
class Config:
    codegen: CodegenConfig = field(default_factory=CodegenConfig)
    tuned: dict[str, CodegenConfig] = field(default_factory=dict)
    disable: bool = False  # PROTEUS_DISABLE
    use_stored_cache: bool = True  # PROTEUS_USE_STORED_CACHE
    cache_dir: str | None = None  # PROTEUS_CACHE_DIR
    cache_max_mb: float = 1024  # PROTEUS_CACHE_MAX_MB (ours)
    dump_ir: bool = False  # PROTEUS_DUMP_LLVM_IR
    # PROTEUS_TRACE_OUTPUT: the known tokens of compat.TRACE_TOKENS that were given
    # (specialization, ir-dump, kernel-trace, cache-stats); an unknown one is noted, not kept.
    trace: frozenset[str] = frozenset()
    # The specialization policy (ours; see proteus_rewrite/policy.py and README "Specialization policy")
    tracker: bool = True  # PROTEUS_TRACKER
    tracker_threshold: int = 8  # PROTEUS_TRACKER_THRESHOLD: T
    tracker_ratio: float = 0.5  # PROTEUS_TRACKER_RATIO: R
    compile_budget: float = 0.1  # PROTEUS_COMPILE_BUDGET: fraction of the kernel's GPU time; 0 = no budget
    compile_grace_ms: float = 2000.0  # PROTEUS_COMPILE_GRACE_MS: what any kernel may spend regardless
    # Read by the shim, checked here (as is PROTEUS_ASYNC_THREADS, 1 to 64); kept for the report.
    # 0: compile on the launching thread; 1: in the background, the original kernel running
    # meanwhile (upstream's two); auto (ours, the default): in the background, and a launch that
    # asks again for a variant still compiling waits for it.
    async_compilation: str = "auto"  # PROTEUS_ASYNC_COMPILATION
    async_threads: int = 1  # PROTEUS_ASYNC_THREADS (from_env: auto_compile_threads() when unset)
    # ours: the run time compiles in a process of its own (jit/process.py); 0: in the app's
    compile_process: bool = True  # PROTEUS_COMPILE_PROCESS
    # ours: time each new variant against the original on live launches before keeping it, and
    # remember the verdict per variant in the cache (runtime/speed.py)
    speed_check: bool = True  # PROTEUS_SPEED_CHECK
    # ours: the code a kernel recorded with both bitcode and PTX is specialized from: auto
    # (bitcode), bitcode (never PTX) or ptx (to compare the two routes on one binary)
    code_kind: str = "auto"  # PROTEUS_CODE_KIND
    # Upstream's timing output (defaults from its Config.h). Timers: a "[proteus] <stage> N ms"
    # line per stage (compat.timer_line); time trace: a Chrome trace JSON file written at exit
    # (compat.chrome_trace), events shorter than the grain left out.
    enable_timers: bool = False  # PROTEUS_ENABLE_TIMERS
    enable_time_trace: bool = False  # PROTEUS_ENABLE_TIME_TRACE
    time_trace_file: str = ""  # PROTEUS_TIME_TRACE_FILE ("": time_trace_path's default)
    time_trace_grain_us: int = 500  # PROTEUS_TIME_TRACE_GRAIN, microseconds
    # The job-wide shared cache tier (ours; docs/user/hpc.md), parsed here, opened by cache.py:
    # a checked URL (file:///abs/dir, redis://, rediss://, redis+unix:///path), None: no shared tier
    cache_shared: str | None = None  # PROTEUS_CACHE_SHARED
    # the HMAC secret of shared entries (PROTEUS_CACHE_SECRET, or the content of
    # PROTEUS_CACHE_SECRET_FILE); never printed
    cache_secret: bytes | None = field(default=None, repr=False)
    cache_umask: int | None = None  # PROTEUS_CACHE_UMASK (octal): for group-shared files
    cache_lease_s: float = 30.0  # PROTEUS_CACHE_LEASE_S: how long a compile claim holds unrenewed
    notes: tuple[str, ...] = ()  # one-line notes for the run time to print once each

    @property
    def time_trace_path(self) -> str:
        # LLVM's timeTraceProfilerWrite(File, "-"), as upstream calls it, names an unset file so.
        return self.time_trace_file or "out.time-trace"

    def for_kernel(self, *names: str) -> CodegenConfig:
        for n in names:
            if n in self.tuned:
                return self.tuned[n]
        return self.codegen

    def for_record(self, kernel) -> CodegenConfig:
        """The settings that apply to a recorded kernel: its own, less what its code kind cannot
        use (a pointer's alignment reaches no PTX instruction, so the PTX route neither keys nor
        folds it)."""
        cg = self.for_kernel(kernel.name, kernel.demangled)
        return dataclasses.replace(cg, specialize_alignment=False) if kernel.code == "ptx" else cg

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        notes: list[str] = []
        codegen = _codegen_from_env(env)
        try:
            max_mb = float(env.get("PROTEUS_CACHE_MAX_MB", "1024") or "1024")
            if not 0 < max_mb < float("inf"):
                raise ValueError
        except ValueError:
            raise ConfigError(f"PROTEUS_CACHE_MAX_MB={env['PROTEUS_CACHE_MAX_MB']!r}: expected a positive number of megabytes") from None
        mode = (env.get("PROTEUS_ASYNC_COMPILATION") or "auto").strip().lower()
        mode = {"true": "1", "yes": "1", "on": "1", "false": "0", "no": "0", "off": "0"}.get(mode, mode)
        if mode not in ASYNC_MODES:
            raise ConfigError(f"PROTEUS_ASYNC_COMPILATION={env['PROTEUS_ASYNC_COMPILATION']!r}: expected 0, 1 or auto")
        if (env.get("PROTEUS_ASYNC_THREADS") or "auto").strip().lower() == "auto":
            threads = auto_compile_threads()
        else:
            threads = int(_number(env, "PROTEUS_ASYNC_THREADS", 1, integer=True))
        if not 1 <= threads <= MAX_COMPILE_THREADS:
            raise ConfigError(f"PROTEUS_ASYNC_THREADS={env['PROTEUS_ASYNC_THREADS']!r}: "
                                  f"expected auto or 1 to {MAX_COMPILE_THREADS}")
        tuned = _tuned(env.get("PROTEUS_TUNED_KERNELS"), codegen, notes)
        config = cls(
            tracker=_bool(env, "PROTEUS_TRACKER", True),
            tracker_threshold=int(_number(env, "PROTEUS_TRACKER_THRESHOLD", 8, integer=True)),
            tracker_ratio=_number(env, "PROTEUS_TRACKER_RATIO", 0.5),
            compile_budget=_number(env, "PROTEUS_COMPILE_BUDGET", 0.1),
            compile_grace_ms=_number(env, "PROTEUS_COMPILE_GRACE_MS", 2000.0),
            async_compilation=mode,
            async_threads=threads,
            compile_process=_bool(env, "PROTEUS_COMPILE_PROCESS", True),
            speed_check=_bool(env, "PROTEUS_SPEED_CHECK", True),
            code_kind=code_kind(env),
            codegen=codegen,
            tuned=tuned,
            disable=_bool(env, "PROTEUS_DISABLE", False),
            use_stored_cache=_bool(env, "PROTEUS_USE_STORED_CACHE", True),
            cache_dir=env.get("PROTEUS_CACHE_DIR") or None,
            cache_max_mb=max_mb,
            dump_ir=_bool(env, "PROTEUS_DUMP_LLVM_IR", False),
            trace=_trace_tokens(env.get("PROTEUS_TRACE_OUTPUT"), notes),
            enable_timers=_soft_bool(env, "PROTEUS_ENABLE_TIMERS", False, notes),
            enable_time_trace=_soft_bool(env, "PROTEUS_ENABLE_TIME_TRACE", False, notes),
            time_trace_file=env.get("PROTEUS_TIME_TRACE_FILE") or "",
            time_trace_grain_us=_grain(env.get("PROTEUS_TIME_TRACE_GRAIN"), notes),
            cache_shared=shared_url(env.get("PROTEUS_CACHE_SHARED")),
            cache_secret=_secret(env),
            cache_umask=_umask(env.get("PROTEUS_CACHE_UMASK")),
            cache_lease_s=_lease(env.get("PROTEUS_CACHE_LEASE_S")),
        )
        notes += compat.env_notes(env)
        return dataclasses.replace(config, notes=tuple(dict.fromkeys(notes)))


def _codegen_from_env(env: Mapping[str, str]) -> CodegenConfig:
    opt = (env.get("PROTEUS_OPT_LEVEL") or "3").strip()
    if opt not in OPT_LEVELS:
        raise ConfigError(f"PROTEUS_OPT_LEVEL={opt!r}: expected one of {', '.join(OPT_LEVELS)}")
    cg_opt = (env.get("PROTEUS_CODEGEN_OPT_LEVEL") or "3").strip()
    if cg_opt not in ("0", "1", "2", "3"):
        raise ConfigError(f"PROTEUS_CODEGEN_OPT_LEVEL={cg_opt!r}: expected 0 to 3")
    compiler = env.get("PROTEUS_PTX_COMPILER", "auto") or "auto"
    if compiler not in PTX_COMPILERS:
        raise ConfigError(f"PROTEUS_PTX_COMPILER={compiler!r}: expected one of {', '.join(PTX_COMPILERS)}")
    return CodegenConfig(
        specialize_args=_bool(env, "PROTEUS_SPECIALIZE_ARGS", True),
        specialize_launch_bounds=_bool(env, "PROTEUS_SPECIALIZE_LAUNCH_BOUNDS", True),
        specialize_dims=_bool(env, "PROTEUS_SPECIALIZE_DIMS", True),
        specialize_dims_range=_bool(env, "PROTEUS_SPECIALIZE_DIMS_RANGE", False),
        specialize_alignment=_bool(env, "PROTEUS_SPECIALIZE_ALIGNMENT", False),
        opt_level=opt,
        codegen_opt_level=int(cg_opt),
        opt_pipeline=env.get("PROTEUS_OPT_PIPELINE") or None,
        ptx_compiler=compiler,
        cap_registers=_bool(env, "PROTEUS_CAP_REGISTERS", True),
        occupancy_step=_bool(env, "PROTEUS_OCCUPANCY_STEP", True),
        ptx_fold_floats=_bool(env, "PROTEUS_PTX_FOLD_FLOATS", False),
        skip_passes=_pass_names(env),
        unroll_threshold=_unroll_threshold(env),
    )


def _unroll_threshold(env: Mapping[str, str]) -> int | None:
    raw = (env.get("PROTEUS_UNROLL_THRESHOLD") or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > 1_000_000:
        raise ConfigError(f"PROTEUS_UNROLL_THRESHOLD={raw!r}: expected a whole number from 0 to 1000000")
    return int(raw)


def code_kind(env: Mapping[str, str]) -> str:
    """PROTEUS_CODE_KIND, checked: auto, bitcode or ptx."""
    kind = (env.get("PROTEUS_CODE_KIND") or "auto").strip().lower()
    if kind not in ("auto", "bitcode", "ptx"):
        raise ConfigError(f"PROTEUS_CODE_KIND={env['PROTEUS_CODE_KIND']!r}: expected auto, bitcode or ptx")
    return kind


def _pass_names(env: Mapping[str, str]) -> tuple[str, ...]:
    if "PROTEUS_SKIP_PASSES" not in env:
        return DEFAULT_SKIPPED
    names = tuple(sorted({n.strip() for n in env["PROTEUS_SKIP_PASSES"].split(",") if n.strip()}))
    bad = [n for n in names if not re.fullmatch(r"[a-z][a-z0-9-]*", n)]
    if bad:
        raise ConfigError(f"PROTEUS_SKIP_PASSES={env['PROTEUS_SKIP_PASSES']!r}: {bad[0]!r} is not a pass name "
                              "as LLVM's pipelines spell them (e.g. indvars, licm)")
    return names


# PROTEUS_ASYNC_THREADS unset or auto: a compile thread per CPUS_PER_COMPILE_THREAD CPUs the process
# may run on, 1 to AUTO_COMPILE_THREADS_MAX (the shim reads the same from shim/protocol.h). A
# thread's compiler process (about 150 MB) starts only when a variant finds the others busy. One
# thread compiles a program's variants one after another: where each takes seconds, the cold run
# ends before they land and its exit waits for them (docs/dev/findings/compile-threads.md).
CPUS_PER_COMPILE_THREAD = 4
AUTO_COMPILE_THREADS_MAX = 4
MAX_COMPILE_THREADS = 64


def auto_compile_threads(cpus: int | None = None) -> int:
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return max(1, min(AUTO_COMPILE_THREADS_MAX, cpus // CPUS_PER_COMPILE_THREAD))


def _number(env, name: str, default: float, integer: bool = False) -> float:
    text = (env.get(name) or "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
        if not 0 <= value < float("inf"):
            raise ValueError
    except ValueError:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise ConfigError(f"{name}={text!r}: expected {kind}") from None
    return value


def _trace_tokens(raw: str | None, notes: list[str]) -> frozenset[str]:
    tokens = [t.strip() for t in (raw or "").split(";") if t.strip()]
    for t in tokens:
        if t not in compat.TRACE_TOKENS:  # upstream: fatal ("Unknown PROTEUS_TRACE_OUTPUT token")
            notes.append(f"PROTEUS_TRACE_OUTPUT: unknown token {t!r} ignored (known: {', '.join(compat.TRACE_TOKENS)})")
    return frozenset(t for t in tokens if t in compat.TRACE_TOKENS)


def _grain(raw: str | None, notes: list[str]) -> int:
    if raw is None or not raw.strip():
        return 500
    try:
        grain = int(raw.strip())
    except ValueError:
        grain = 0
    if grain <= 0:  # upstream: fatal ("PROTEUS_TIME_TRACE_GRAIN must be > 0")
        notes.append(f"PROTEUS_TIME_TRACE_GRAIN={raw!r}: expected microseconds > 0; using 500")
        return 500
    return grain


# ---------------------------------------------------------------- the shared tier (PROTEUS_CACHE_SHARED ...)

SHARED_SCHEMES = ("file", "redis", "rediss", "redis+unix")


def redacted_url(url: str) -> str:
    """`url` with a password shown as ***: an error line may end up in a job's log."""
    return re.sub(r"^([a-z+]+://)([^@/]*:)[^@/]*@", r"\1\2***@", url.strip(), flags=re.I)


def shared_url(raw: str | None) -> str | None:
    """PROTEUS_CACHE_SHARED checked: file:///abs/dir, redis://[:password@]host[:port][/db],
    rediss://... (TLS) or redis+unix:///path[?db=N]; None when unset or empty. A malformed value
    is a ConfigError naming the variable and what is wrong (a password shown as ***)."""
    if raw is None or not raw.strip():
        return None
    url = raw.strip()

    def bad(why: str) -> ConfigError:
        return ConfigError(f"PROTEUS_CACHE_SHARED={redacted_url(url)!r}: {why}")

    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SHARED_SCHEMES:
        raise bad("expected a file:///abs/dir, redis://host[:port][/db], rediss://... or "
                  "redis+unix:///path URL" + (f" (unknown scheme {parts.scheme!r})" if parts.scheme else ""))
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise bad("a file:// URL needs an absolute directory, as in file:///scratch/proteus-cache")
        if parts.query or parts.fragment:
            raise bad("a file:// URL takes no ?query or #fragment")
        return url
    if scheme == "redis+unix":
        if parts.hostname or not parts.path.startswith("/"):  # redis+unix://:password@/path is fine
            raise bad("a redis+unix:// URL needs an absolute socket path, as in redis+unix:///tmp/redis.sock?db=0")
        db = urllib.parse.parse_qs(parts.query).get("db", ["0"])[-1]
        if not db.isdigit():
            raise bad(f"the database ?db={db} is not a non-negative integer")
        return url
    if not parts.hostname:
        raise bad(f"a {scheme}:// URL needs a host, as in {scheme}://node17:6379/0")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise bad("the port is not a number from 1 to 65535")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise bad(f"the database /{db} is not a non-negative integer")
    return url


def _secret(env: Mapping[str, str]) -> bytes | None:
    text, path = env.get("PROTEUS_CACHE_SECRET") or "", env.get("PROTEUS_CACHE_SECRET_FILE") or ""
    if text and path:
        raise ConfigError("PROTEUS_CACHE_SECRET and PROTEUS_CACHE_SECRET_FILE are both set: set one of them")
    if text:
        return text.encode()
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"PROTEUS_CACHE_SECRET_FILE={path!r}: cannot read it: {exc.strerror or exc}") from None
    if not secret:
        raise ConfigError(f"PROTEUS_CACHE_SECRET_FILE={path!r}: the file is empty")
    return secret


def _umask(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    text = raw.strip().lower()
    try:
        value = int(text[2:] if text.startswith("0o") else text, 8)
        if not 0 <= value <= 0o777:
            raise ValueError
    except ValueError:
        raise ConfigError(f"PROTEUS_CACHE_UMASK={raw!r}: expected an octal umask from 000 to 777, such as 002") from None
    return value


def _lease(raw: str | None) -> float:
    if raw is None or not raw.strip():
        return 30.0
    try:
        value = float(raw.strip())
        if not 0 < value < float("inf"):
            raise ValueError
    except ValueError:
        raise ConfigError(f"PROTEUS_CACHE_LEASE_S={raw!r}: expected a positive number of seconds") from None
    return value


# ---------------------------------------------------------------- PROTEUS_TUNED_KERNELS


def _tuned(path: str | None, env_codegen: CodegenConfig, notes: list[str]) -> dict[str, CodegenConfig]:
    if not path:
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise ConfigError(f"PROTEUS_TUNED_KERNELS: cannot read: {exc.strerror or exc}", path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"PROTEUS_TUNED_KERNELS: not JSON ({exc})", path) from None
    if not isinstance(doc, dict):
        raise ConfigError("PROTEUS_TUNED_KERNELS: the top level must be an object {kernel: {...}}", path)
    # Upstream's keys left out take upstream's defaults; this tool's own settings stay the environment's.
    base = CodegenConfig(ptx_compiler=env_codegen.ptx_compiler, specialize_alignment=env_codegen.specialize_alignment,
                         cap_registers=env_codegen.cap_registers, occupancy_step=env_codegen.occupancy_step)
    out = {}
    for kernel, entry in doc.items():
        if not isinstance(entry, dict):  # upstream skips it silently
            notes.append(f"PROTEUS_TUNED_KERNELS: {kernel!r}: not an object: skipped")
            continue
        changes = {}
        for key, value in entry.items():
            name, note = _tuned_value(key, value)
            if note:
                notes.append(f"PROTEUS_TUNED_KERNELS: {kernel!r}: {note}")
            if name:
                changes[name] = _normalized(name, value)
        out[kernel] = dataclasses.replace(base, **changes)
    return out


def _tuned_value(key: str, value: object) -> tuple[str | None, str | None]:
    """(the CodegenConfig field the value sets, or None; a note, or None) for one tuned key."""
    spec = compat.TUNED_KEYS.get(key) or compat.OWN_TUNED_KEYS.get(key)
    if spec is None:  # upstream ignores it silently
        known = ", ".join([*compat.TUNED_KEYS, *compat.OWN_TUNED_KEYS])
        return None, f"unknown key {key!r} ignored (known: {known})"
    name, kind = spec
    shown = json.dumps(value)
    if compat.json_kind(value) != kind:
        return None, f"{key} {shown} is not a JSON {kind}: ignored, as upstream ignores it{_hint(kind, value)}"
    problem = _bad_tuned_value(key, value)
    if problem:
        return None, f"{key} {shown}: {problem}"
    if key == "CodeGen":
        return None, None if value.lower() == "rtc" else f"CodeGen {shown} has no effect here: {_codegen_why()}"
    return name, None


def _bad_tuned_value(key: str, value) -> str | None:
    if key == "Pipeline" and not value.strip():
        return "an empty pipeline: ignored"
    if key == "CodeGen" and value.lower() not in compat.CODEGEN_OPTIONS:
        return "not rtc, serial or parallel (upstream stops: 'Unknown codegen option'): ignored"
    if key == "OptLevel" and value[:1] not in OPT_LEVELS:
        return f"upstream reads only its first character, {value[:1]!r}, not one of {' '.join(OPT_LEVELS)}: ignored, 3 used"
    if key == "CodeGenOptLevel" and not 0 <= value <= 3:
        return "expected 0 to 3: ignored, 3 used"
    if key == "TunedMaxThreads" and not (value == -1 or value >= 1):
        return "expected a number of threads (-1: none): ignored"
    if key == "MinBlocksPerSM" and value < 0:
        return "expected 0 or more blocks: ignored"
    return None


def _normalized(name: str, value):
    if name == "opt_level":
        return value[:1]  # upstream keeps the first character
    if name in ("codegen_opt_level", "tuned_max_threads", "min_blocks_per_sm"):
        value = int(value)
        # Upstream's "none" values (-1 threads, 0 blocks) are None here, so that an entry
        # that spells them out shares its cache key with one that leaves them out.
        return None if (name == "tuned_max_threads" and value == -1) or (name == "min_blocks_per_sm" and value == 0) else value
    return value


def _hint(kind: str, value: object) -> str:
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"; write {json.dumps(str(value))}"
    if kind == "boolean" and value in (0, 1):
        return f"; write {json.dumps(bool(value))}"
    if kind == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return f"; write {value.strip()}"
    return ""


def _codegen_why() -> str:
    return next(v.why for v in compat.UPSTREAM_ENV if v.name == "PROTEUS_CODEGEN")
