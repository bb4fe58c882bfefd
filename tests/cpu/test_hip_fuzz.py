"""The HIP parsers under the same bounded fuzzing as the CUDA ones (tests/cpu/test_fuzz.py runs
every target; this makes sure the HIP samples they mutate are built first, or says why not)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from bench.lib.fuzz_targets import HIP_TARGETS, TARGETS, run_one

from ..support.hip_samples import hip_samples


@pytest.mark.parametrize("name", HIP_TARGETS)
def test_hip_parser_never_crashes_on_mutated_input(name):
    hip_samples()
    _, strategy = TARGETS[name]

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy())
    def check(data):
        run_one(name, data)

    check()
