"""proteus-rewrite: run-time specialization of GPU kernels in already-built executables."""

__version__ = "0.1.0"
