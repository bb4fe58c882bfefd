"""How an embedded module was built: read from the clang -cc1 command line recorded beside it
(`llvm_$_cmdline` in a cubin, `.llvmcmd` in an AMDGPU code object) and from the PTX that the
same compilation put beside it.

The recipes seen, with clang 19:
  -Xclang -fembed-bitcode=all   (recommended) one device compilation with the GPU target: the
                                AOT code is a real sm_XX build, and the module is embedded
                                *before* optimization (no -disable-llvm-passes on its line).
  -fembed-bitcode               (the driver flag) splits device compilation in two; the second
                                step (bitcode -> PTX, -disable-llvm-passes) gets no -target-cpu,
                                so the AOT PTX is `.target sm_30` and the embedded module is the
                                already-optimized one. Slower AOT code, and programs that need
                                newer PTX (warp shuffles, votes, wmma) do not build at all.
  two steps with the target     optimize, then `-cc1 -target-cpu X -fembed-bitcode=all
                                -disable-llvm-passes` (samples/build_hip.py): optimized module,
                                real target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RECOMMENDED_FLAGS = ("-Xclang", "-fembed-bitcode=all")
RECOMMENDED = " ".join(RECOMMENDED_FLAGS)
_SM = re.compile(r"sm_(\d+)")


@dataclass(frozen=True)
class Recipe:
    name: str  # "-Xclang -fembed-bitcode=all", "-fembed-bitcode", "two-step", "unknown"
    embedded: str  # the module was embedded "before optimization", "after optimization", or "unknown"
    target_cpu: str | None  # what the device compilation was told to build for
    opt_level: str | None  # the compile's -O level: "0".."3", "s", "z"
    problem: str | None  # why the AOT code is handicapped, or None
    # -ffp-contract: "fast" (clang's default for CUDA and HIP) lets a variant fuse other
    # multiply-adds than the AOT code; "on" or "off" give identical results (docs/user/build.md)
    fp_contract: str = "fast"

    @property
    def optimized(self) -> bool:
        return self.embedded == "after optimization"


def classify(cmdline: tuple[str, ...] | list[str], triple: str = "", ptx_target: str | None = None,
             arch: int | str | None = None) -> Recipe:
    """The recipe of one module. `ptx_target`: the `.target` of the PTX that came with it;
    `arch`: the SM version of the cubin it came in (CUDA)."""
    args = list(cmdline)
    if not args:
        return Recipe("unknown", "unknown", None, None, None, "unknown")
    target_cpu = args[args.index("-target-cpu") + 1] if "-target-cpu" in args[:-1] else None
    opt = next((a[2:] for a in reversed(args) if re.fullmatch(r"-O[0-3sz]?", a)), None)
    opt = "2" if opt == "" else opt  # -O alone means -O2 (clang's driver passes the number, but cc1 takes it)
    after = "-disable-llvm-passes" in args or "-disable-llvm-optzns" in args
    embedded = "after optimization" if after else "before optimization"
    nvptx = triple.startswith("nvptx") or "nvptx64-nvidia-cuda" in args
    problem = None
    ptx_sm = int(m.group(1)) if ptx_target and (m := _SM.search(ptx_target)) else None
    if nvptx and target_cpu is None:
        problem = "its device code was compiled without a GPU target (clang's -fembed-bitcode drops -target-cpu)"
    if ptx_sm is not None and isinstance(arch, int) and ptx_sm < arch:
        problem = (f"its AOT PTX is for sm_{ptx_sm}, below the sm_{arch} it runs on"
                   + (" (clang's -fembed-bitcode drops -target-cpu)" if target_cpu is None else ""))
    if not after:
        name = "-Xclang -fembed-bitcode=all"
    elif target_cpu is None:
        name = "-fembed-bitcode"
    else:
        name = "two-step"
    contract = next((a.split("=", 1)[1] for a in reversed(args) if a.startswith("-ffp-contract=")), "fast")
    return Recipe(name, embedded, target_cpu, opt, problem, "fast" if contract == "fast-honor-pragmas" else contract)


def advice(app: str, recipe: Recipe) -> str:
    """The one warning a handicapped build gets."""
    return (f"{app}: built with clang's {recipe.name}: {recipe.problem}, so the kernels it ships are slower than a "
            f"real build and new PTX (warp shuffles, votes) cannot build; rebuild with `{RECOMMENDED}` "
            "instead of -fembed-bitcode (README: Build recipe)")
