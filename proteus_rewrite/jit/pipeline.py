"""The optimization pipeline: PROTEUS_TUNED_KERNELS "Pipeline" > PROTEUS_OPT_PIPELINE >
PROTEUS_OPT_LEVEL (default 3), as upstream Proteus selects it.

llvmlite 0.50 cannot parse LLVM's textual pipelines, so a textual pipeline is read here:
a comma-separated list of passes, where `default<O0..O3|Os|Oz>` runs LLVM's standard
pipeline and `module(...)`, `cgscc(...)`, `function(...)`, `loop(...)` only group passes
(llvmlite adapts function and loop passes itself). Every pass llvmlite exposes is
accepted under its LLVM name; any other name is an error that lists the known ones.
Os and Oz run LLVM's O2 pipeline (llvmlite has no size-level option).
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm

from ..errors import SpecializeError

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


def run(module: llvm.ModuleRef, tm: llvm.TargetMachine, text: str) -> None:
    """Run the pipeline over the module, in order."""
    pending: llvm.ModulePassManager | None = None
    for item in parse(text):
        m = _DEFAULT.fullmatch(item)
        if m:
            if pending is not None:
                pending.run(module, _builder(tm, 2))
                pending = None
            level = m.group(1)
            if level == "0":
                continue
            pb = _builder(tm, int(level) if level.isdigit() else 2)
            pb.getModulePassManager().run(module, pb)
        else:
            pending = pending or llvm.create_new_module_pass_manager()
            getattr(pending, PASSES[item])()
    if pending is not None:
        pending.run(module, _builder(tm, 2))


def _builder(tm: llvm.TargetMachine, speed: int) -> llvm.PassBuilder:
    return llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=speed))
