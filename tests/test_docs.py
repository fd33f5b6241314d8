"""The documentation stands alone: every relative link in README.md and docs/*.md resolves to a file
in the repository (and, where it names one, to a heading there), and README.md links every docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = _slug(match.group(1))
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_slugs_are_githubs():
    assert _slug("Side by side with llama.cpp (`bench.peers`)") == "side-by-side-with-llamacpp-benchpeers"
    assert _slug("Sampling, speculation and beam search") == "sampling-speculation-and-beam-search"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for link in links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_relative_to(ROOT), f"{link}: outside the repository"
        assert target.exists(), f"{link}: no such file"
        if anchor:
            assert target.suffix == ".md", f"{link}: an anchor into a file that is not Markdown"
            assert anchor in anchors(target), f"{link}: no heading with that anchor in {target.relative_to(ROOT)}"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in links(ROOT / "README.md")}
    assert [page.name for page in PAGES[1:] if page not in linked] == []


def test_the_readme_opens_with_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]
    assert len(readme.splitlines()) <= 160
