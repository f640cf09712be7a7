"""docs/README.md indexes every page; results say how they were made (issue 52).

A page nobody can find is a page nobody updates, and a figure without its command and commits
cannot be checked or regenerated. So: every markdown page under docs/ is linked from the index
or marked historical; every results page opens with its command, commits, date and machine; every
results JSON records its command (repository-relative) and commits; every relative link resolves.
"""

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
HEADER = ("Command", "Commits", "Date", "Machine")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
ABSOLUTE = re.compile(r"(?:^|[\s=:,])(/(?:work|tmp|home|Users|root)/)")


def links(page: Path) -> set[Path]:
    """The local files a markdown page links to, resolved against its folder."""
    text = page.read_text(encoding="utf-8")
    return {(page.parent / t).resolve() for t in LINK.findall(text) if "://" not in t}


def header(page: Path) -> dict[str, str]:
    """The `- **Field:** value` lines between a results page's title and its first prose."""
    fields, lines = {}, page.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), f"{page.relative_to(ROOT)}: no '# ' title line"
    for line in lines[2:]:
        match = re.match(r"- \*\*(\w+):\*\* (.+)", line)
        if match:
            fields[match[1]] = match[2].strip()
        elif not line.startswith("  "):  # a field's value may wrap onto indented lines
            break
    return fields


def results_pages() -> list[Path]:
    return sorted((DOCS / "results").rglob("*.md"))


def is_historical(page: Path) -> bool:
    return "historical" in page.relative_to(DOCS).parts or "Historical" in header(page)


def test_every_page_is_indexed_or_historical():
    indexed = links(INDEX)
    pages = [p for p in sorted(DOCS.rglob("*.md")) if p != INDEX]
    lost = [
        str(p.relative_to(ROOT))
        for p in pages
        if p.resolve() not in indexed and not (p in results_pages() and is_historical(p))
    ]
    assert pages and not lost, f"link these from docs/README.md (or mark them historical): {lost}"


def test_every_page_sits_in_guide_or_results():
    loose = [str(p.relative_to(ROOT)) for p in DOCS.glob("*.md") if p != INDEX]
    assert not loose, f"move these into docs/guide/ or docs/results/: {loose}"


@pytest.mark.parametrize("page", results_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_results_page_opens_with_its_header(page):
    fields = header(page)
    missing = [f for f in HEADER if not fields.get(f)]
    assert not missing, f"{page.relative_to(ROOT)}: its header lacks {missing}"
    assert not ABSOLUTE.search(fields["Command"]), f"{page.relative_to(ROOT)}: a machine path"


@pytest.mark.parametrize(
    "path", sorted((DOCS / "results").rglob("*.json")), ids=lambda p: str(p.relative_to(DOCS))
)
def test_every_results_json_records_its_command_and_commits(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    command, commits = record.get("command"), record.get("commits")
    commands = command if isinstance(command, list) else [command]
    assert all(isinstance(c, str) and c for c in commands), f"{path.name}: no command"
    assert commits, f"{path.name}: no commits"
    assert not any(ABSOLUTE.search(c) for c in commands), f"{path.name}: a machine path"


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)} -> {os.path.relpath(target, ROOT)}"
        for page in pages
        for target in links(page)
        if not target.exists()
    ]
    assert not broken, f"broken links: {broken}"


def test_the_readme_first_screen_links_getting_started():
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:20])
    assert "docs/guide/getting-started.md" in first_screen
    assert "docs/README.md" in first_screen
