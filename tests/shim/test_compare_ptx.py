"""shim/compare_ptx.h is what scripts/compare_ptx.py makes of shim/compare.cu, and ptxas
assembles it (the driver builds it at run time, for the GPU the app runs on)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import compare_ptx

PTXAS = Path("/usr/local/cuda/bin/ptxas")


def _text(header: str) -> str:
    return "".join(eval(line.strip().rstrip(";")) for line in header.splitlines() if line.strip().startswith('"'))  # noqa: S307


@pytest.mark.skipif(compare_ptx.nvcc() is None, reason="no nvcc: the header cannot be made again here")
def test_the_header_is_made_from_the_source():
    assert (compare_ptx.SHIM / "compare_ptx.h").read_text() == compare_ptx.header(compare_ptx.ptx(compare_ptx.nvcc())), (
        "shim/compare_ptx.h is stale: run `python scripts/compare_ptx.py`")


@pytest.mark.skipif(not PTXAS.exists(), reason="no ptxas")
def test_the_compare_kernel_assembles_for_the_oldest_and_newest_targets(tmp_path):
    ptx = tmp_path / "compare.ptx"
    ptx.write_text(_text((compare_ptx.SHIM / "compare_ptx.h").read_text()))
    assert ".version 7.0" in ptx.read_text() and ".entry proteus_differs(" in ptx.read_text()
    for arch in ("sm_75", "sm_90"):
        subprocess.run([str(PTXAS), f"-arch={arch}", str(ptx), "-o", str(tmp_path / f"{arch}.cubin")], check=True)
