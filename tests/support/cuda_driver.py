"""Just enough of the CUDA driver API (through cuda-bindings) for the GPU tests."""

from __future__ import annotations

import ctypes

import numpy as np
from cuda.bindings import driver as cu


def check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err.name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class Context:
    def __init__(self):
        check(cu.cuInit(0))
        self.dev = check(cu.cuDeviceGet(0))
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.dev))
        check(cu.cuCtxSetCurrent(self.ctx))

    def load(self, image: bytes):
        return check(cu.cuModuleLoadData(image))

    def function(self, module, name: str):
        return check(cu.cuModuleGetFunction(module, name.encode()))

    def global_address(self, module, name: str) -> int:
        ptr, _size = check(cu.cuModuleGetGlobal(module, name.encode()))
        return int(ptr)

    def alloc(self, host: np.ndarray) -> int:
        ptr = check(cu.cuMemAlloc(host.nbytes))
        check(cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        return int(ptr)

    def read(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        check(cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def write(self, ptr: int, host: np.ndarray) -> None:
        check(cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))

    def launch(self, fn, grid, block, args: list[bytes]) -> None:
        """args: each parameter's bytes, exactly as recorded (what the runtime would pass)."""
        bufs = [ctypes.create_string_buffer(a, len(a)) for a in args]
        ptrs = (ctypes.c_void_p * len(bufs))(*[ctypes.addressof(b) for b in bufs])
        check(cu.cuLaunchKernel(fn, *grid, *block, 0, 0, ctypes.addressof(ptrs), 0))
        check(cu.cuCtxSynchronize())
