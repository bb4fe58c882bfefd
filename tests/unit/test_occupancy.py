"""Blocks per SM against CUDA's occupancy calculator (CUDA_Occupancy_Calculator.xls and
cudaOccupancyMaxActiveBlocksPerMultiprocessor give these for a kernel without shared memory)."""

import pytest

from proteus_rewrite.jit import occupancy


@pytest.mark.parametrize(
    "registers, threads, arch, blocks",
    [
        (130, 256, 90, 1),  # 17 units of 256 per warp: 15 warps fit, one block of 8
        (128, 256, 90, 2),  # HeCBench rsbench: Proteus's variant at 126 ran 1.74x the AOT code's 130
        (126, 256, 90, 2),
        (32, 256, 90, 8),  # the warp limit (64) binds, not the registers
        (32, 256, 86, 6),  # sm_86 holds 48 warps
        (24, 64, 75, 16),  # sm_75: 16 blocks at most
        (255, 1024, 90, 0),  # does not fit at all: 255 per thread needs 2048 threads' worth of file
        (64, 1024, 90, 1),
        (168, 192, 90, 2),  # sw4ck kernel1, Proteus's variant
        (255, 192, 90, 1),  # sw4ck kernel1, AOT
    ],
)
def test_blocks_per_sm(registers, threads, arch, blocks):
    assert occupancy.blocks_per_sm(registers, threads, arch) == blocks


def test_budget_keeps_the_aot_blocks_and_no_more_registers_than_that():
    assert occupancy.register_budget(168, 256, 90) == 255  # one block either way: no reason to spill
    assert occupancy.register_budget(130, 256, 90) == 255
    assert occupancy.register_budget(128, 256, 90) == 128  # 129 would drop to one block
    assert occupancy.register_budget(45, 256, 90) == 48  # allocation is in units of 8 per thread
    assert occupancy.register_budget(32, 256, 90) == 32


def test_unknown_architecture_keeps_the_aot_count():
    assert occupancy.blocks_per_sm(64, 256, 37) is None
    assert occupancy.register_budget(64, 256, 37) == 64
