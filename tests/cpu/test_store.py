"""The kernel store: round trip, checksums, versions, atomic writes."""

from __future__ import annotations

import os
import struct

import pytest

from proteus_rewrite import store
from proteus_rewrite.errors import StoreError


@pytest.mark.parametrize("app", ["loop_count", "two_tu_rdc", "templates", "mixed_nvcc", "loop_count_multi_arch"])
def test_store_round_trip_keeps_the_whole_table(table, tmp_path, app):
    t = table(app)
    path = store.write(t, tmp_path / "x.kstore")
    back = store.read(path)
    assert back == t
    assert [m.code for m in back.modules] == [m.code for m in t.modules]


def test_store_write_is_atomic_and_replaces_an_old_store(table, tmp_path):
    path = tmp_path / "app.kstore"
    store.write(table("loop_count"), path)
    store.write(table("templates"), path)
    assert store.read(path).app.name == "templates"
    assert os.listdir(tmp_path) == ["app.kstore"]  # no temporary file left behind


def test_identical_bitcode_is_stored_once(table, tmp_path):
    t = table("loop_count")  # the cubin and the PTX carry the same module
    data = store.serialize(t)
    assert data.count(t.modules[0].code) == 1


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d[:40], "too short"),
        (lambda d: b"NOTASTOR" + d[8:], "bad magic"),
        (lambda d: d[:8] + struct.pack("<I", 99) + d[12:], "format 99"),
        (lambda d: d[:-10], "truncated"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda d: d[:70] + bytes([d[70] ^ 0x01]) + d[71:], "checksum mismatch"),
    ],
)
def test_damaged_store_is_refused_with_a_reason(table, tmp_path, mutate, message):
    data = store.serialize(table("loop_count"))
    p = tmp_path / "bad.kstore"
    p.write_bytes(mutate(data))
    with pytest.raises(StoreError, match=message):
        store.read(p)


def test_missing_store_says_how_to_make_one(tmp_path):
    with pytest.raises(StoreError, match="run `proteus-rewrite APP` first"):
        store.read(tmp_path / "none.kstore")


def test_unwritable_destination_is_a_store_error(table, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot write"):
        store.write(table("loop_count"), blocker / "sub" / "x.kstore")
