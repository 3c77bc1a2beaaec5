"""What a newcomer notices first: a README read in ten minutes, links that lead somewhere, documents that
give the current state rather than its history, and module docstrings that state a contract in a screen."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted([README, *(ROOT / "docs").glob("*.md")])
PACKAGES = ("collectors", "hub", "sim", "analytics", "alerts", "ui", "fleetlens")
MODULES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))

README_MAX_LINES = 250
DOCSTRING_MAX_LINES = 30

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
ORDINALS = (
    "second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
    "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
# History has no place in a document: which run a figure came from, when a run ran, which commit or issue
# came before. Example timestamps (`2026-11-30T10:00Z`), log lines, alert fingerprints (16 hex digits),
# sha256 sums and hex colours are not history and do not match.
RUN_NUMBER = rf"\b(?:the|in|of|from) (?:{ORDINALS}|\d+(?:st|nd|rd|th)) runs?\b"
RUN_TIME = r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s*-\s*\d{1,2}:\d{2}(?::\d{2})?)? UTC\b"
RUN_DATE = r"\b20\d\d-[01]\d-[0-3]\d\b(?!T)"
COMMIT = r"(?<![\w#/:=-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)(?:[0-9a-f]{7,12}|[0-9a-f]{40})(?![\w-])"
HISTORY = {
    "a run's number": re.compile(RUN_NUMBER, re.IGNORECASE),
    "a run's time": re.compile(RUN_TIME),
    "a run's date": re.compile(RUN_DATE),
    "a commit hash": re.compile(COMMIT),
    "an issue's number": re.compile(r"\bissue \d+\b", re.IGNORECASE),
}


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_readme_is_a_ten_minute_read() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; details belong in docs/"


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {_relative(linked)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_a_document_gives_the_current_state_not_its_history(page: Path) -> None:
    text = page.read_text()
    found = [
        f"line {text.count(chr(10), 0, match.start()) + 1}: {what} {match.group()!r}"
        for what, pattern in HISTORY.items()
        for match in pattern.finditer(text)
    ]
    assert not found, found


@pytest.mark.parametrize("page", [page for page in PAGES if page != README], ids=_relative)
def test_a_page_opens_with_what_the_reader_can_do_with_it(page: Path) -> None:
    lines = [line for line in page.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# "), "a page starts with its title"
    assert not lines[1].startswith(("#", "```", "|", "-", "!")), (
        "the title is followed by a sentence of prose"
    )


@pytest.mark.parametrize("module", MODULES, ids=_relative)
def test_a_module_docstring_states_its_contract_in_a_screen(module: Path) -> None:
    docstring = ast.get_docstring(ast.parse(module.read_text())) or ""
    lines = len(docstring.splitlines())
    assert lines <= DOCSTRING_MAX_LINES, f"{lines} lines: figures go to docs/performance.md, design to docs/"
