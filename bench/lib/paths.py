"""Where things are in the repository, for the scripts that run from it (not the corpus
runners, which travel in tarballs and find their files beside themselves)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
WORK = BENCH / "work"  # scratch builds (ignored by git)
APPS = BENCH / "corpora" / "apps"
APPS_BUILD = APPS / "build"  # the suite's workloads, built by `python -m bench.corpora.apps.build`
SAMPLES_BUILD = ROOT / "samples" / "build"
