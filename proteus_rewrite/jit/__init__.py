"""The JIT specializer: recorded bitcode + one launch -> specialized PTX/cubin.

config      PROTEUS_* configuration
launch      the launch (argument bytes, dims, arch, global addresses) and constant folding
ir          the specialized LLVM module
pipeline    the optimization pipeline
codegen     PTX and cubin generation
specializer the whole step, with its cache key and timings
"""

from .config import CodegenConfig, Config
from .launch import Launch

__all__ = ["CodegenConfig", "Config", "Launch", "Result", "specialize"]


def __getattr__(name: str):
    # llvmlite is loaded only when something is compiled: a warm run never pays for it.
    if name in ("Result", "specialize"):
        from . import specializer

        return getattr(specializer, name)
    raise AttributeError(name)
