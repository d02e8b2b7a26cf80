"""The user docs (README.md, docs/*.md) are a manual: no lab-notebook provenance (dates, commit
hashes, issue numbers) and no links to files a clone does not have. Provenance lives in
BENCHMARKS.md and NOTES.md, which this test does not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
FORBIDDEN = {
    "a date": re.compile(rf"\b\d{{1,2}} (?:{MONTHS})[a-z]* 20\d\d\b|\b20\d\d-\d\d-\d\d\b"),
    "an issue number": re.compile(r"\bissues? \d+", re.I),
    "a commit hash": re.compile(r"\bcommit `?[0-9a-f]{7,40}\b|\((?:[0-9a-f]{7}|[0-9a-f]{40})\)"),
    "a file outside the repository": re.compile(
        r"\.\./shared/(?:reference|PROTOCOL|data/README)|PROTOCOL\.md|paper\.tex|--data_dir \.\./shared"
    ),
}


@pytest.mark.parametrize("path", MANUAL, ids=lambda p: p.name)
def test_manual_page_has_no_lab_notebook_provenance(path):
    hits = [
        f"{path.name}:{n}: {what}: {m.group(0)!r}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, rx in FORBIDDEN.items()
        for m in rx.finditer(line)
    ]
    assert not hits, "move provenance to BENCHMARKS.md or NOTES.md:\n" + "\n".join(hits)


def test_readme_links_the_quickstart_near_its_top():
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:30]
    assert any("docs/quickstart.md" in line for line in head)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("path", MANUAL, ids=lambda p: p.name)
def test_manual_links_to_files_and_sections_that_exist(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no such section in {dest.name}")
    assert not broken, f"{path.name}: " + "; ".join(broken)
