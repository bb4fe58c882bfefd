"""The optimization pipeline: PROTEUS_TUNED_KERNELS "Pipeline" > PROTEUS_OPT_PIPELINE >
PROTEUS_OPT_LEVEL (default 3), as upstream Proteus selects it.

llvmlite 0.50 cannot parse LLVM's textual pipelines, so a textual pipeline is read here:
a comma-separated list of passes, where `default<O0..O3|Os|Oz>` runs LLVM's standard
pipeline and `module(...)`, `cgscc(...)`, `function(...)`, `loop(...)` only group passes
(llvmlite adapts function and loop passes itself). Every pass llvmlite exposes is
accepted under its LLVM name; any other name is an error that lists the known ones.
llvmlite has no size level, so Os and Oz are done as clang does the most of them: every
defined function gets `optsize` (Oz: and `minsize`), which the passes of LLVM's O2 pipeline
read (the unroller then unrolls nothing that grows the code), and the inliner's threshold is
LLVM's for that size level (50, 5). What the size level changes in the pipeline's own shape
(a few passes' options) is not done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecializeError

if TYPE_CHECKING:  # loading LLVM waits until something compiles: key_note serves cache lookups
    import llvmlite.binding as llvm

# LLVM pass name -> llvmlite NewPassManager method
PASSES = {
    "aa-eval": "add_aa_eval_pass",
    "adce": "add_aggressive_dce_pass",
    "aggressive-instcombine": "add_aggressive_instcombine_pass",
    "always-inline": "add_always_inliner_pass",
    "argpromotion": "add_argument_promotion_pass",
    "break-crit-edges": "add_break_critical_edges_pass",
    "constmerge": "add_constant_merge_pass",
    "dce": "add_dead_code_elimination_pass",
    "deadargelim": "add_dead_arg_elimination_pass",
    "dse": "add_dead_store_elimination_pass",
    "function-attrs": "add_post_order_function_attributes_pass",
    "globaldce": "add_global_dead_code_eliminate_pass",
    "globalopt": "add_global_opt_pass",
    "instcombine": "add_instruction_combine_pass",
    "instnamer": "add_instruction_namer_pass",
    "ipsccp": "add_ipsccp_pass",
    "jump-threading": "add_jump_threading_pass",
    "lcssa": "add_lcssa_pass",
    "loop-deletion": "add_loop_deletion_pass",
    "loop-reduce": "add_loop_strength_reduce_pass",
    "loop-rotate": "add_loop_rotate_pass",
    "loop-simplify": "add_loop_simplify_pass",
    "loop-unroll": "add_loop_unroll_pass",
    "loop-unroll-and-jam": "add_loop_unroll_and_jam_pass",
    "lower-atomic": "add_lower_atomic_pass",
    "lower-invoke": "add_lower_invoke_pass",
    "lower-switch": "add_lower_switch_pass",
    "reg2mem": "add_register_to_memory_pass",
    "memcpyopt": "add_mem_copy_opt_pass",
    "mergefunc": "add_merge_functions_pass",
    "newgvn": "add_new_gvn_pass",
    "partial-inliner": "add_partial_inliner_pass",
    "reassociate": "add_reassociate_pass",
    "rpo-function-attrs": "add_rpo_function_attrs_pass",
    "sccp": "add_sccp_pass",
    "simplifycfg": "add_simplify_cfg_pass",
    "sink": "add_sinking_pass",
    "sroa": "add_sroa_pass",
    "strip-dead-prototypes": "add_strip_dead_prototype_pass",
    "tailcallelim": "add_tail_call_elimination_pass",
    "verify": "add_verifier",
}
ADAPTORS = ("module", "cgscc", "function", "loop", "loop-mssa")
_DEFAULT = re.compile(r"default<O([0123sz])>")


def parse(text: str) -> list[str]:
    """Flatten a textual pipeline into pass names (`default<Ox>` kept as one item)."""
    items: list[str] = []
    token, depth = "", 0
    for c in text.replace(" ", "") + ",":
        if c == "(":
            if token in ADAPTORS:
                token, depth = "", depth + 1
                continue
            raise SpecializeError(f"pipeline {text!r}: pass parameters are not supported ({token}(...))")
        if c in ",)":
            if token:
                if not (_DEFAULT.fullmatch(token) or token in PASSES):
                    raise SpecializeError(
                        f"pipeline {text!r}: unknown or unsupported pass {token!r}; supported: "
                        f"default<O0|O1|O2|O3|Os|Oz>, {', '.join(sorted(PASSES))}"
                    )
                items.append(token)
            token = ""
            if c == ")":
                depth -= 1
                if depth < 0:
                    raise SpecializeError(f"pipeline {text!r}: unbalanced parentheses")
            continue
        token += c
    if depth != 0:
        raise SpecializeError(f"pipeline {text!r}: unbalanced parentheses")
    return items


def pipeline_text(opt_level: str, opt_pipeline: str | None) -> str:
    return opt_pipeline or f"default<O{opt_level}>"


@dataclass(frozen=True)
class Tuning:
    """The pipeline tuning options of the AOT compile, from its recorded command line: clang
    passes -vectorize-loops and -vectorize-slp at -O2 and above (LLVM's own default leaves SLP
    vectorization off) and -fno-unroll-loops when asked. A module embedded after optimization
    was recorded by a second step whose line has none of them (-disable-llvm-passes): the first
    step's are clang's defaults for the -O level it names."""

    loop_vectorization: bool = True
    slp_vectorization: bool = True
    loop_unrolling: bool = True
    # -ffp-contract: clang's default for CUDA is "fast" (no flag on the line), which its backend
    # gets as TargetOptions::AllowFPOpFusion = Fast (codegen.fp_contraction reproduces it)
    fp_contract: str = "fast"

    @classmethod
    def from_cmdline(cls, cmdline: tuple[str, ...] | list[str]) -> Tuning:
        args = set(cmdline)
        if not args:
            return cls()
        unroll = "-fno-unroll-loops" not in args
        contract = next((a.split("=", 1)[1] for a in reversed(list(cmdline)) if a.startswith("-ffp-contract=")), "fast")
        contract = "fast" if contract == "fast-honor-pragmas" else contract
        if "-disable-llvm-passes" in args or "-disable-llvm-optzns" in args:
            level = next((a[2:] for a in reversed(list(cmdline)) if re.fullmatch(r"-O[0-3sz]?", a)), "2") or "2"
            on = level in ("2", "3", "s")
            return cls(on, on and level != "s", unroll, contract)
        return cls("-vectorize-loops" in args, "-vectorize-slp" in args, unroll, contract)


_skipped: frozenset[str] | None = None  # what this process told LLVM to skip


def skip(names: tuple[str, ...]) -> None:
    """Have LLVM's pipelines skip the passes `names` (LLVM's -opt-disable), from now on in this
    process: the option only adds, so a pass once skipped cannot run again here, and asking
    for it is an error (the variant is not made; the original kernel runs). Call it before the
    module's LLVM context is made: a context reads the option when it is created."""
    global _skipped
    import llvmlite.binding as llvm

    wanted = frozenset(names)
    if _skipped is not None and not _skipped <= wanted:
        raise SpecializeError(f"PROTEUS_SKIP_PASSES: this process already skips {', '.join(sorted(_skipped))}, "
                              "and LLVM cannot run a skipped pass again in the same process")
    added = wanted - (_skipped or frozenset())
    if added:
        llvm.set_option("proteus", "-opt-disable=" + ",".join(sorted(added)))
    _skipped = wanted


_unroll: int | None = None  # the -unroll-threshold this process gave LLVM


def unroll_threshold(value: int | None) -> None:
    """LLVM's -unroll-threshold from now on in this process (None: leave LLVM's own). LLVM takes
    a command-line option once per process, so a second, different value is refused (the
    variant is not made; the original kernel runs), as `skip` refuses."""
    global _unroll
    if value is None or value == _unroll:
        return
    if _unroll is not None:
        raise SpecializeError(f"PROTEUS_UNROLL_THRESHOLD: this process already unrolls at {_unroll}, and LLVM takes "
                              "the option once per process")
    import llvmlite.binding as llvm

    llvm.set_option("proteus", f"-unroll-threshold={value}")
    _unroll = value


def run(module: llvm.ModuleRef, tm: llvm.TargetMachine, text: str, tuning: Tuning = Tuning()) -> None:
    """Run the pipeline over the module, in order."""
    import llvmlite.binding as llvm

    pending: llvm.ModulePassManager | None = None
    for item in parse(text):
        m = _DEFAULT.fullmatch(item)
        if m:
            if pending is not None:
                pending.run(module, _builder(tm, 2, tuning=tuning))
                pending = None
            level = m.group(1)
            if level == "0":
                continue
            if level in SIZE_INLINE_THRESHOLD:
                _optimize_for_size(module, minsize=level == "z")
            pb = _builder(tm, int(level) if level.isdigit() else 2, SIZE_INLINE_THRESHOLD.get(level), tuning)
            pb.getModulePassManager().run(module, pb)
        else:
            pending = pending or llvm.create_new_module_pass_manager()
            getattr(pending, PASSES[item])()
    if pending is not None:
        pending.run(module, _builder(tm, 2, tuning=tuning))


SIZE_INLINE_THRESHOLD = {"s": 50, "z": 5}  # LLVM's InlineConstants::OptSizeThreshold, OptMinSizeThreshold


def key_note(text: str) -> str | None:
    """For the cache key, how this pipeline's size levels are done (they once ran plain O2,
    under the same key); None where it has none, so that other keys stay as they were."""
    return "optsize/minsize attributes, inliner 50/5" if re.search(r"default<O[sz]>", text) else None


def _optimize_for_size(module: llvm.ModuleRef, minsize: bool) -> None:
    """What clang's -Os / -Oz put on every function (not on an optnone one: the verifier
    refuses both together)."""
    for fn in module.functions:
        if fn.is_declaration or any(b"optnone" in a.split() for a in fn.attributes):
            continue
        fn.add_function_attribute("optsize")
        if minsize:
            fn.add_function_attribute("minsize")


def _builder(tm: llvm.TargetMachine, speed: int, inline_threshold: int | None = None,
             tuning: Tuning = Tuning()) -> llvm.PassBuilder:
    import llvmlite.binding as llvm

    pto = llvm.create_pipeline_tuning_options(speed_level=speed)
    pto.loop_vectorization = tuning.loop_vectorization
    pto.slp_vectorization = tuning.slp_vectorization
    pto.loop_unrolling = tuning.loop_unrolling
    if inline_threshold is not None:
        pto.inlining_threshold = inline_threshold
    return llvm.create_pass_builder(tm, pto)
