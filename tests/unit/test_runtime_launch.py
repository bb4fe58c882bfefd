"""A launch's bytes decoded once (runtime/launch.py), the report's launch record written and read
back in one place (runtime/report.py: LaunchRecord), and the targets that tell the platforms
apart (jit/targets.py: target_for)."""

from __future__ import annotations

import struct

import pytest

from proteus_rewrite.fatbin.table import KernelRecord, ParamRecord
from proteus_rewrite.jit.targets import Amdgpu, Nvptx, document_arch, target_for
from proteus_rewrite.runtime import protocol
from proteus_rewrite.runtime.launch import decode_deferred, decode_launch
from proteus_rewrite.runtime.report import LaunchRecord


def _record(sizes=(8, 4, 4), globals_=("bias",)) -> KernelRecord:
    params = tuple(ParamRecord(i, "int", "i32", s, 0, s) for i, s in enumerate(sizes))
    return KernelRecord("_Z1kPfii", "k(float*, int, int)", 0, 90, 0, (), params, sum(sizes), globals_, None, None, None,
                        "cubin")


def test_a_launch_is_split_per_parameter_with_its_device_variables_addresses():
    launch = decode_launch(_record(), bytes(range(16)), (4, 1, 1), (256, 1, 1), struct.pack("<Q", 0x7F00))
    assert launch.args == (bytes(range(8)), bytes(range(8, 12)), bytes(range(12, 16)))
    assert (launch.grid, launch.block, launch.addresses) == ((4, 1, 1), (256, 1, 1), (0x7F00,))


def test_short_bytes_never_raise():
    """No exception may reach the shim: short arguments are left for Launch.check to refuse,
    a missing address reads as unknown (0)."""
    launch = decode_launch(_record(), bytes(10), (1, 1, 1), (1, 1, 1), b"")
    assert [len(a) for a in launch.args] == [8, 2, 0] and launch.addresses == (0,)


def test_deferred_launches_are_read_in_order_and_a_partial_record_is_ignored():
    record = _record()
    one = protocol.DEFERRED.pack(4, 1, 1, 256, 1, 1) + bytes(16)
    two = protocol.DEFERRED.pack(8, 1, 1, 128, 1, 1) + bytes(range(16))
    seen = list(decode_deferred(record, one + two + two[:10]))
    assert [(s.grid, s.block) for s in seen] == [((4, 1, 1), (256, 1, 1)), ((8, 1, 1), (128, 1, 1))]
    assert seen[1].args[2] == bytes(range(12, 16)) and seen[1].addresses == (0,)


def test_a_launch_record_round_trips_and_unfolds_what_the_tracker_stopped_folding():
    record = _record()
    launch = decode_launch(record, bytes(range(16)), (4, 1, 1), (256, 1, 1), struct.pack("<Q", 0x7F00))
    written = LaunchRecord.of(launch, (2, 1), {"grid"}, 90, record).to_json()
    assert written == {"args": {"1": "08090a0b", "2": "0c0d0e0f"}, "unknown_dims": ["grid"], "arch": 90,
                       "block": [256, 1, 1], "grid": [4, 1, 1], "globals": {"bias": 0x7F00}}
    read = LaunchRecord.from_json(written)
    assert read.to_json() == written
    unfolded = read.without(["1", "block"])
    assert unfolded.to_json()["args"] == {"2": "0c0d0e0f"} and unfolded.unknown_dims == ("block", "grid")
    again = unfolded.launch(record)  # what prewarm compiles: the unfolded ones zero and unknown
    assert again.args == (bytes(8), bytes(4), bytes(range(12, 16))) and again.unknown == frozenset({0, 1})
    assert again.unknown_dims == frozenset({"block", "grid"}) and again.globals == {"bias": 0x7F00}
    assert LaunchRecord.from_json({**written, "arch": "gfx90a"}).arch == "gfx90a"


@pytest.mark.parametrize("doc", ["not a launch", {"args": ["08000000"], "arch": 90},
                                 {"args": {"1": "08"}, "unknown_dims": 5, "arch": 90},
                                 {"args": {"1": "08"}, "arch": 90, "grid": [1, 1], "block": [1, 1, 1]},
                                 {"args": {"1": "zz"}, "arch": 90, "grid": [1, 1, 1], "block": [1, 1, 1]},
                                 {"args": {}, "arch": None, "grid": [1, 1, 1], "block": [1, 1, 1]}])
def test_a_malformed_launch_record_is_refused(doc):
    with pytest.raises((ValueError, TypeError, KeyError, AttributeError)):
        LaunchRecord.from_json(doc)


def test_the_target_is_the_one_place_that_tells_the_platforms_apart():
    assert target_for(90) == Nvptx(90) and target_for("gfx90a:sramecc+:xnack-") == Amdgpu("gfx90a")
    cuda, hip = target_for(90), target_for("gfx90a")
    assert (cuda.platform, hip.platform) == ("cuda", "hip")
    assert cuda.folds_dims and cuda.speed_trials and cuda.validates and cuda.loads_ahead and cuda.caps_registers
    assert not (hip.folds_dims or hip.speed_trials or hip.validates or hip.loads_ahead or hip.caps_registers)
    assert cuda.accepts(80) and hip.accepts("gfx90a") and not hip.accepts("gfx940")
    assert "CUDA error 200" in cuda.load_failure(200) and "HIP error 200" in hip.load_failure(200)
    with pytest.raises(TypeError):
        target_for(None)
    assert document_arch("gfx90a") == "gfx90a" and document_arch(90) == 90
