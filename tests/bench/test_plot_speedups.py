"""bench/plot_speedups.py: a proteus_compare results file drawn as a PNG, standard library only."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

from bench import plot_speedups as ps

from ..conftest import ROOT


def _doc(programs: dict) -> dict:
    def series(median: float) -> dict:
        return {"metrics": {"avg kernel ms": {"median": median}}}
    return {"stamp": {"commit": "abc1234", "gpu": "Fake GPU, 1.0"},
            "programs": {p: {k: series(v) for k, v in s.items()} for p, s in programs.items()}}


def _pixels(png: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB rows without their filter bytes) of the PNG plot_speedups writes."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    idat = b""
    off = 8
    while off < len(png):
        (n,), kind = struct.unpack(">I", png[off:off + 4]), png[off + 4:off + 8]
        if kind == b"IDAT":
            idat += png[off + 8:off + 8 + n]
        off += 12 + n
    raw = zlib.decompress(idat)
    rows = b"".join(raw[y * (width * 3 + 1) + 1:(y + 1) * (width * 3 + 1)] for y in range(height))
    return width, height, rows


def _has(rows: bytes, rgb: tuple[int, int, int]) -> bool:
    return bytes(rgb) in {rows[i:i + 3] for i in range(0, len(rows), 3)}


def test_speedups_follow_each_figures_direction():
    # adam's figure is a time (lower is better): plain 2 ms, ours 1 ms is 2x
    rows = ps.speedups(_doc({"adam": {"plain": 2.0, "ours_warm": 1.0, "proteus_warm": 4.0}}))
    assert rows == [("adam", "avg kernel ms", {"ours_warm": 2.0, "proteus_warm": 0.5})]


def test_a_series_whose_output_differed_has_no_speed():
    doc = _doc({"wsm5": {"plain": 3.0, "ours_warm": 1.0, "proteus_warm": 1.5}})
    doc["programs"]["wsm5"]["ours_warm"]["all_ok"] = False
    assert ps.speedups(doc) == [("wsm5", "avg kernel ms", {"ours_warm": None, "proteus_warm": 2.0})]
    assert ps.draw(doc)[:4] == b"\x89PNG"


def test_each_series_in_the_file_gets_its_bars_and_the_rest_none():
    png = ps.draw(_doc({"adam": {"plain": 2.0, "ours_warm": 1.0, "proteus_warm": 1.6},
                        "wsm5": {"plain": 3.0, "ours_warm": 2.0}}))
    width, height, rows = _pixels(png)
    assert width == 1100 and len(rows) == width * height * 3
    colours = {key: rgb for key, _label, rgb in ps.SERIES}
    assert _has(rows, colours["ours_warm"]) and _has(rows, colours["proteus_warm"])
    assert not _has(rows, colours["nvcc"]) and not _has(rows, colours["ours_nvcc_warm"])  # not in this file


def test_the_command_draws_a_results_file_and_refuses_one_without_figures(tmp_path):
    good, bad = tmp_path / "r.json", tmp_path / "empty.json"
    good.write_text(json.dumps(_doc({"adam": {"plain": 2.0, "ours_warm": 1.0}})))
    bad.write_text(json.dumps({"programs": {}}))
    out = tmp_path / "p.png"
    proc = subprocess.run([sys.executable, "-m", "bench.plot_speedups", str(good), str(out), "--commit", "f00d"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and out.read_bytes()[:4] == b"\x89PNG", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "bench.plot_speedups", str(bad), str(tmp_path / "q.png")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.startswith(f"plot_speedups: {bad}: no program")
    assert "Traceback" not in proc.stderr and not (tmp_path / "q.png").exists()
