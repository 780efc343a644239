"""Every relative link in README.md and docs/*.md resolves to a file of the tree (and an
anchor, when it names one, to a heading of that file); the README links every page of docs/;
the front door stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.markdown import DOCS, README, REPO, heading_anchors, relative_links

PAGES = [README, *DOCS]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve()
        assert path.is_file(), f"{page.name}: link {link!r}: no file {path.relative_to(REPO)}"
        if anchor and path.suffix == ".md":
            assert anchor in heading_anchors(path), f"{page.name}: link {link!r}: no such heading"


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / link.partition("#")[0]).resolve()
              for link in relative_links(README)}
    for page in DOCS:
        assert page.resolve() in linked, f"README.md does not link {page.relative_to(REPO)}"
    for name in ("deployment", "slo", "api", "operations", "planning", "benchmarks",
                 "architecture"):
        assert (REPO / "docs" / f"{name}.md").resolve() in linked, f"README: no docs/{name}.md"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "the README carries no dates"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_development_diary(page: Path) -> None:
    pattern = r"\bsessions?\b" if page == README else r"session [0-9]"
    assert not re.search(pattern, page.read_text(), re.IGNORECASE)
