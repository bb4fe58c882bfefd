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
from .specializer import Result, specialize

__all__ = ["CodegenConfig", "Config", "Launch", "Result", "specialize"]
