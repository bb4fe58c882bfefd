"""Is there a usable NVIDIA GPU here? (For the demo, the tests' `gpu` marker and reports.)"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class GpuStatus:
    available: bool
    reason: str  # why not, or a description of the device
    compute_capability: tuple[int, int] | None = None
    driver_version: int | None = None


@lru_cache(maxsize=1)
def status() -> GpuStatus:
    """Probe the CUDA driver once: cuInit, device 0, its compute capability."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return GpuStatus(False, "cuda-bindings is not installed")
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # the binding raises when libcuda.so itself is missing
        return GpuStatus(False, f"no CUDA driver ({exc})")
    if err != driver.CUresult.CUDA_SUCCESS:
        return GpuStatus(False, f"cuInit failed: {err.name} (no CUDA driver or no GPU)")
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return GpuStatus(False, "the CUDA driver reports no GPU")
    _, dev = driver.cuDeviceGet(0)
    _, name = driver.cuDeviceGetName(128, dev)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    _, version = driver.cuDriverGetVersion()
    label = name.split(b"\0", 1)[0].decode()
    return GpuStatus(True, f"{label} (sm_{major}{minor}, driver API {version})", (major, minor), version)
