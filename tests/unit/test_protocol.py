"""The C<->Python contract is written once: shim/protocol.h is what runtime/protocol.py
generates, the shim uses its names rather than literals, and the run time packs and unpacks with
the same objects."""

from __future__ import annotations

import re
from pathlib import Path

from proteus_rewrite.inject import shim
from proteus_rewrite.runtime import protocol

SHIM = Path(__file__).resolve().parents[2] / "shim"


def test_the_shims_header_is_the_generated_one():
    assert (SHIM / "protocol.h").read_text() == protocol.header(), (
        "shim/protocol.h is stale: run `python -m proteus_rewrite.runtime > shim/protocol.h`")


def test_every_call_into_python_uses_the_protocols_names_and_formats():
    sources = {n: (SHIM / n).read_text() for n in shim.SOURCES}
    calls = [(n, m.group(1)) for n, text in sources.items() for m in re.finditer(r"py\.CallFunction\(\w+, ([^,)]+)", text)]
    assert calls and all(fmt.startswith(("FMT_", "passes_deferred ? FMT_")) for _, fmt in calls), calls
    for n, text in sources.items():
        assert not re.search(r'GetAttrString\(rt, "', text), f"{n} names a runtime function outside protocol.h"
        assert not re.search(r'getenv\("PROTEUS_', text), f"{n} reads a PROTEUS_ variable outside protocol.h"
    used = {m.group(1) for text in sources.values() for m in re.finditer(r"\bFMT_([A-Z_]+)", text)}
    assert used == {c.name.upper() for c in protocol.CALLS}, "a call the protocol declares is unused, or the reverse"


def test_the_runtime_has_every_function_the_shim_calls():
    from proteus_rewrite import runtime

    for call in protocol.CALLS:
        name = call.name.removesuffix("_hip").removesuffix("_ahead")
        assert callable(getattr(runtime, name)), name


def test_report_figures_are_as_many_as_the_shim_passes():
    write_report = next(c for c in protocol.CALLS if c.name == "write_report")
    assert write_report.format.count("K") == len(protocol.WAIT_FIELDS) + 1  # + the unknown launches
    assert f"W_COUNT == {len(protocol.WAIT_FIELDS)}" in (SHIM / "python.c").read_text()
