"""The specialization policy: value tracker and compile budget (pure Python, no GPU)."""

from __future__ import annotations

import struct

from proteus_rewrite.policy import (
    BLOCK,
    GRID,
    Budget,
    Tracker,
    compiles_likely,
    decode_learned,
    decode_run,
    encode_learned,
    encode_run,
    policy_key,
    run_key,
)


def launch(tracker: Tracker, step: int, alpha: float = 2.0, block: int = 256, grid: int = 64) -> None:
    values = {0: struct.pack("<i", step), 1: struct.pack("<f", alpha), BLOCK: struct.pack("<3I", block, 1, 1),
              GRID: struct.pack("<3I", grid, 1, 1)}
    tracker.before({k: v for k, v in values.items()})


def test_a_changing_scalar_stops_being_folded_after_T_variants_and_a_constant_one_stays():
    t = Tracker(threshold=8, ratio=0.5, folded={0, 1}, dims=3)
    for step in range(1000):
        launch(t, step)
        if 0 not in t.folded:
            break
    assert t.dropped == ["0"]
    assert t.folded == {1} and t.dims == 3  # the constant and the dims are still folded
    assert t.variants == 10  # T + 1 variants with the counter folded, then the generic one
    for step in range(1000, 2000):  # from here on every launch is the same variant: no new ones
        launch(t, step)
    assert t.variants == 10


def test_threads_with_their_own_constants_still_drop_the_counter():
    """changing_scalars with P threads: thread t launches k = j + t with its own salt. In some
    interleavings every (k, salt) pair is new and k's distinct / variants stays at or below R:
    the ratio alone never dropped k (one of the interleavings below passes the bound). With n_k > T
    as well, k goes once it had T + 1 values, each with at most P salts: at most
    P x (T + 1) variants before, P after, and one more if the salt goes too."""
    import random

    for threads in (1, 4, 8):
        bound = threads * (8 + 2) + 1
        for seed in range(60):
            rng = random.Random(seed)
            rates = [rng.random() for _ in range(threads)]  # each thread at its own pace
            t = Tracker(threshold=8, ratio=0.5, folded={0, 1}, dims=3)
            pos = [0] * threads
            picks = rng.choices(range(threads), weights=rates, k=200 * threads)
            for i, tid in enumerate(picks):
                tid = tid if seed else i % threads  # seed 0: in step
                launch(t, pos[tid] + tid, alpha=float(tid + 1))  # alpha: the thread's own constant (its salt)
                pos[tid] += 1
            assert "0" in t.dropped and t.variants <= bound, (threads, seed, t.variants, t.dropped)


def test_few_distinct_values_stay_folded():
    t = Tracker(threshold=8, ratio=0.5, folded={0, 1}, dims=3)
    for i in range(500):
        launch(t, i % 3, alpha=float(i % 2))  # 3 x 2 combinations
    assert t.dropped == [] and t.variants == 6


def test_changing_grid_stops_grid_folding_only():
    t = Tracker(threshold=4, ratio=0.5, folded={0, 1}, dims=3)
    for g in range(1, 100):
        launch(t, 7, grid=g)
    assert t.dropped == [GRID] and t.dims == 1 and t.folded == {0, 1}


def test_annotated_arguments_are_never_dropped():
    t = Tracker(threshold=2, ratio=0.5, folded={0, 1}, dims=0, fixed=frozenset({0}))
    for step in range(50):
        launch(t, step)
    assert 0 in t.folded and t.dropped == []
    assert t.variants == 50  # annotation is the user's word: every value is a variant


def test_the_same_values_again_are_not_a_new_variant():
    t = Tracker(threshold=1, ratio=0.1, folded={0}, dims=0)
    for _ in range(10):
        launch(t, 5)
    assert t.variants == 1 and t.dropped == []


def test_budget():
    b = Budget(fraction=0.1, grace_ms=1000)
    assert b.allows(999, 0) and not b.allows(1000, 0)
    assert b.allows(1500, 20000) and not b.allows(2000, 20000)


def test_saved_decisions_round_trip_and_never_touch_annotated_arguments():
    assert decode_learned(encode_learned(["2", GRID])) == [2, GRID]
    assert decode_learned(b"{not json") == [] and decode_learned(b'{"stopped_folding": ["x", 3, "1"]}') == [1]
    t = Tracker(threshold=8, ratio=0.5, folded={0, 1, 2}, dims=3, fixed=frozenset({1}))
    t.start_from([1, 2, GRID, 7])  # 1 is annotated, 7 is no slot of this kernel
    assert t.folded == {0, 1} and t.dims == 1 and t.learned == ["2", GRID] and t.dropped == ["2", GRID]
    keys = {policy_key("ab", "k", 90, 8, 0.5), policy_key("ab", "k", 90, 8, 0.25), policy_key("ab", "k", 80, 8, 0.5),
            policy_key("cd", "k", 90, 8, 0.5), policy_key("ab", "j", 90, 8, 0.5)}
    assert len(keys) == 5


def test_the_run_note_round_trips_and_a_malformed_one_says_nothing():
    assert decode_run(encode_run(0)) == 0 and decode_run(encode_run(12)) == 12
    for bad in (b"", b"[]", b'{"compiled": -1}', b'{"compiled": true}', b'{"compiled": "3"}', b'{"other": 1}'):
        assert decode_run(bad) is None, bad
    # the key names the app's fat binaries, in any order, and nothing else
    assert run_key(["a", "b"]) == run_key(["b", "a"]) != run_key(["a"]) != run_key(["a", "c"])
    assert run_key(["a"]) != policy_key("a", "k", 90, 8, 0.5)


def test_only_a_run_after_one_that_compiled_nothing_leaves_the_compiler_cold():
    assert compiles_likely(None)  # the first run, or a malformed note
    assert compiles_likely(1) and compiles_likely(40)
    assert not compiles_likely(0)
