"""What the corpus runners share (bench/corpora/hecbench/run.py, bench/corpora/upstream_tests/run.py):
a PROTEUS_REPORT summed over its kernels.

Standard library only: the corpus tarballs carry this file (as bench/lib/harness.py, beside
bench/__init__.py and bench/lib/__init__.py) to GPU hosts that have nothing but Python."""

from __future__ import annotations


def report_share(report: dict) -> dict:
    """From a PROTEUS_REPORT (runtime.write_report): launches, specialized launches, their
    share, fallbacks, and the failures summed over kernels by reason."""
    launches = specialized = fallbacks = 0
    failures: dict[str, int] = {}
    for k in report.get("kernels", []):
        launches += int(k.get("launches", 0))
        specialized += int(k.get("specialized_launches", 0))
        fallbacks += int(k.get("fallback_launches", 0))
        for reason, count in (k.get("failures") or {}).items():
            failures[reason] = failures.get(reason, 0) + int(count)
    return {"launches": launches, "specialized_launches": specialized, "fallback_launches": fallbacks,
            "share": round(specialized / launches, 4) if launches else None, "failures": failures,
            "kernels": len(report.get("kernels", [])),
            "unknown_handle_launches": report.get("unknown_handle_launches", 0)}
