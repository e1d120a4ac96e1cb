"""Every relative link in README.md and docs/*.md leads somewhere: the file (or folder) exists,
and a ``#fragment`` names a heading of the page it points to, by GitHub's anchor rule."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _prose(markdown: str) -> str:
    """The page without fenced blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (not ``-`` or
    ``_``), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page: its headings' (the second of two alike gets ``-1``), and any
    ``<a name>`` or ``<a id>``."""
    markdown = page.read_text()
    found: set[str] = set(_HTML_ANCHOR.findall(markdown))
    seen: Counter[str] = Counter()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    return _LINK.findall(_prose(page.read_text()))


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_anchors_follow_githubs_rule() -> None:
    assert slug("1. Mixed-adapter batches on the CPU engine (`make bench-lora`)") == (
        "1-mixed-adapter-batches-on-the-cpu-engine-make-bench-lora"
    )
    assert slug("What a request costs") == "what-a-request-costs"
    assert slug("Turns by objectives") == "turns-by-objectives"


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## Some part\n\n## Some part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#some-part) [ok too](other.md#some-part-1) [web](https://example.com/x)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n[self](#title-here)\n"
    )
    assert broken(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
        "#title-here: no heading #title-here in page.md",
    ]
