"""JIT configuration from PROTEUS_* environment variables, with upstream Proteus's names,
syntax and defaults (docs: README, "Configuration").

Per-kernel overrides come from PROTEUS_TUNED_KERNELS, a JSON file
{kernel: {Pipeline, SpecializeArgs, LaunchBounds, SpecializeDims, SpecializeDimsRange,
OptLevel, CodeGenOptLevel, TunedMaxThreads, MinBlocksPerSM}}; a kernel is named by its
mangled or demangled name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import SpecializeError

OPT_LEVELS = ("0", "1", "2", "3", "s", "z")
ASYNC_MODES = ("0", "1", "auto")
PTX_COMPILERS = ("auto", "nvjitlink", "ptxas", "driver")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if raw.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise SpecializeError(f"{name}={raw!r}: expected 0 or 1")


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
    cap_registers: bool = True  # PROTEUS_CAP_REGISTERS (ours): at most the AOT code's registers per thread

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
    trace: frozenset[str] = frozenset()  # PROTEUS_TRACE_OUTPUT: specialization;ir-dump;kernel-trace
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
    async_threads: int = 1  # PROTEUS_ASYNC_THREADS
    # ours: the run time compiles in a process of its own (jit/process.py); 0: in the app's
    compile_process: bool = True  # PROTEUS_COMPILE_PROCESS

    def for_kernel(self, *names: str) -> CodegenConfig:
        for n in names:
            if n in self.tuned:
                return self.tuned[n]
        return self.codegen

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        opt = env.get("PROTEUS_OPT_LEVEL", "3") or "3"
        if opt not in OPT_LEVELS:
            raise SpecializeError(f"PROTEUS_OPT_LEVEL={opt!r}: expected one of {', '.join(OPT_LEVELS)}")
        cg_opt = env.get("PROTEUS_CODEGEN_OPT_LEVEL", "3") or "3"
        if cg_opt not in ("0", "1", "2", "3"):
            raise SpecializeError(f"PROTEUS_CODEGEN_OPT_LEVEL={cg_opt!r}: expected 0 to 3")
        compiler = env.get("PROTEUS_PTX_COMPILER", "auto") or "auto"
        if compiler not in PTX_COMPILERS:
            raise SpecializeError(f"PROTEUS_PTX_COMPILER={compiler!r}: expected one of {', '.join(PTX_COMPILERS)}")
        codegen = CodegenConfig(
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
        )
        try:
            max_mb = float(env.get("PROTEUS_CACHE_MAX_MB", "1024") or "1024")
            if not 0 < max_mb < float("inf"):
                raise ValueError
        except ValueError:
            raise SpecializeError(f"PROTEUS_CACHE_MAX_MB={env['PROTEUS_CACHE_MAX_MB']!r}: expected a positive number of megabytes") from None
        trace = frozenset(t.strip() for t in (env.get("PROTEUS_TRACE_OUTPUT") or "").split(";") if t.strip())
        mode = (env.get("PROTEUS_ASYNC_COMPILATION") or "auto").strip().lower()
        mode = {"true": "1", "yes": "1", "on": "1", "false": "0", "no": "0", "off": "0"}.get(mode, mode)
        if mode not in ASYNC_MODES:
            raise SpecializeError(f"PROTEUS_ASYNC_COMPILATION={env['PROTEUS_ASYNC_COMPILATION']!r}: expected 0, 1 or auto")
        threads = int(_number(env, "PROTEUS_ASYNC_THREADS", 1, integer=True))
        if not 1 <= threads <= 64:
            raise SpecializeError(f"PROTEUS_ASYNC_THREADS={env['PROTEUS_ASYNC_THREADS']!r}: expected 1 to 64")
        return cls(
            tracker=_bool(env, "PROTEUS_TRACKER", True),
            tracker_threshold=int(_number(env, "PROTEUS_TRACKER_THRESHOLD", 8, integer=True)),
            tracker_ratio=_number(env, "PROTEUS_TRACKER_RATIO", 0.5),
            compile_budget=_number(env, "PROTEUS_COMPILE_BUDGET", 0.1),
            compile_grace_ms=_number(env, "PROTEUS_COMPILE_GRACE_MS", 2000.0),
            async_compilation=mode,
            async_threads=threads,
            compile_process=_bool(env, "PROTEUS_COMPILE_PROCESS", True),
            codegen=codegen,
            tuned=_tuned(env.get("PROTEUS_TUNED_KERNELS"), codegen),
            disable=_bool(env, "PROTEUS_DISABLE", False),
            use_stored_cache=_bool(env, "PROTEUS_USE_STORED_CACHE", True),
            cache_dir=env.get("PROTEUS_CACHE_DIR") or None,
            cache_max_mb=max_mb,
            dump_ir=_bool(env, "PROTEUS_DUMP_LLVM_IR", False),
            trace=trace,
        )


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
        raise SpecializeError(f"{name}={text!r}: expected {kind}") from None
    return value


_TUNED_FIELDS = {
    "Pipeline": ("opt_pipeline", str),
    "SpecializeArgs": ("specialize_args", bool),
    "LaunchBounds": ("specialize_launch_bounds", bool),
    "SpecializeDims": ("specialize_dims", bool),
    "SpecializeDimsRange": ("specialize_dims_range", bool),
    "OptLevel": ("opt_level", str),
    "CodeGenOptLevel": ("codegen_opt_level", int),
    "TunedMaxThreads": ("tuned_max_threads", int),
    "MinBlocksPerSM": ("min_blocks_per_sm", int),
    "CapRegisters": ("cap_registers", bool),  # ours: PROTEUS_CAP_REGISTERS for one kernel
}


def _tuned(path: str | None, base: CodegenConfig) -> dict[str, CodegenConfig]:
    if not path:
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise SpecializeError(f"PROTEUS_TUNED_KERNELS: cannot read: {exc.strerror or exc}", path) from None
    except json.JSONDecodeError as exc:
        raise SpecializeError(f"PROTEUS_TUNED_KERNELS: not JSON ({exc})", path) from None
    if not isinstance(doc, dict):
        raise SpecializeError("PROTEUS_TUNED_KERNELS: the top level must be an object {kernel: {...}}", path)
    out = {}
    for kernel, entry in doc.items():
        if not isinstance(entry, dict):
            raise SpecializeError(f"PROTEUS_TUNED_KERNELS: entry for {kernel!r} is not an object", path)
        changes = {}
        for key, value in entry.items():
            if key not in _TUNED_FIELDS:
                raise SpecializeError(f"PROTEUS_TUNED_KERNELS: {kernel!r}: unknown key {key!r}", path)
            name, typ = _TUNED_FIELDS[key]
            if typ is bool and isinstance(value, int):
                value = bool(value)
            elif typ is str and isinstance(value, int):
                value = str(value)
            if not isinstance(value, typ):
                raise SpecializeError(f"PROTEUS_TUNED_KERNELS: {kernel!r}: {key} must be {typ.__name__}", path)
            changes[name] = value
        out[kernel] = dataclasses.replace(base, **changes)
    return out
