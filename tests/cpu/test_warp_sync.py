"""The warp_sync sample's kernels (legacy warp-synchronous code: lanes hand values to each other
through memory, no atomics, no __syncwarp), specialized on the CPU: with the loop count folded,
the optimizer merges a lane's loads and stores across steps, which is what changes the result
on the GPU when another lane writes in between. The default check catches it there
(tests/gpu/test_validate.py runs the sample in the default mode); here, that the hazard is real
in the code the JIT makes."""

from __future__ import annotations

import re

from ..conftest import run_cli


def _ptx(samples, tmp_path, kernel: str, *args: str) -> str:
    out = tmp_path / f"{kernel}.ptx"
    proc = run_cli("specialize", str(samples / "warp_sync"), kernel, *args, "--emit", "ptx", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


def _body(ptx: str) -> str:
    return ptx[ptx.index(".entry"):]


def test_lane_ordered_reads_its_neighbour_once_for_every_round(samples, tmp_path):
    """Natively each of the 4 rounds reads the left neighbour's value anew (another lane may have
    written it); the variant reads it once, multiplies by the folded round count and stores once."""
    body = _body(_ptx(samples, tmp_path, "lane_ordered", "--arg", "1=4", "--block", "32", "--grid", "2048"))
    assert len(re.findall(r"\bld\.global", body)) == 2 and len(re.findall(r"\bst\.global", body)) == 1
    assert len(re.findall(r"\bbra\b", body)) == 1  # lane 0's early exit: no loop left
    assert re.search(r"shl\.b32\s+%r\d+, %r\d+, 2;", body)  # the neighbour's value times the 4 rounds


def test_legacy_reduce_loads_every_partner_before_its_one_store(samples, tmp_path):
    """Natively each halving step stores s[tid] before the next reads a partner another lane may
    just have updated; the variant (width folded, the loop unrolled) loads the five partners and
    stores the sum once."""
    body = _body(_ptx(samples, tmp_path, "legacy_reduce", "--arg", "2=32", "--block", "32", "--grid", "2048"))
    shared = [m.group(1) for m in re.finditer(r"\b(ld|st)\.shared", body)]
    first_store_after_loads = "".join("l" if x == "ld" else "s" for x in shared)
    assert "lllll" in first_store_after_loads and first_store_after_loads.count("s") <= 3, first_store_after_loads


def test_the_loop_count_folded_is_what_merges_them(samples, tmp_path):
    """Without the count folded, lane_ordered's rounds stay a loop that stores on every round."""
    body = _body(_ptx(samples, tmp_path, "lane_ordered", "--block", "32", "--grid", "2048"))
    assert re.search(r"\bst\.global", body) and len(re.findall(r"\bbra\b", body)) >= 2  # the rounds' loop
