"""Fuzzing the parsers with a bounded budget (CI). Every input either parses or raises a
ProteusError with a one-line message; bench/micro/fuzz.py runs the same targets far longer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from bench.lib.fuzz_targets import HIP_TARGETS, TARGETS, run_one

from ..support.hip_samples import hip_samples

EXAMPLES = 300  # per target in CI; bench/micro/fuzz.py for the long runs


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_parser_never_crashes_on_mutated_input(samples, name):
    if name in HIP_TARGETS:
        hip_samples()  # built, or a skip that says which tool is missing
    _, strategy = TARGETS[name]

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy())
    def check(data):
        run_one(name, data)

    check()
