"""The documentation's relative links: each names a file of the tree and, with a #fragment, a
heading of that file (GitHub's anchor: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/*.md"), ROOT / "bench/results/README.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    fenced, out = False, set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            out.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return out


def test_github_anchor_rule():
    page = ROOT / "docs/dev/findings/preload.md"
    assert "loading-a-warm-runs-variants-ahead-proteus_preload" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for link in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, frag = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif frag and target.suffix == ".md" and frag not in anchors(target):
            broken.append(f"{link}: no such heading")
    assert not broken, broken
