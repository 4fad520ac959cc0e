"""The project's own documentation stands alone: README.md and docs/*.md link only to files a clone
has (and to headings that exist), never to documents outside the repository, and the README's
"How it is built" table names every top-level folder of the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
NOT_SHIPPED = ("var", "test-artifacts", "node_modules", "build", "dist")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def test_no_document_outside_the_repository_is_mentioned():
    for path in DOC_FILES:
        text = path.read_text()
        for outside in ("../shared", "shared/DESIGN", "shared/DOMAIN", "DESIGN.md", "DOMAIN.md"):
            assert outside not in text, f"{path.relative_to(ROOT)} mentions {outside}, which a clone does not have"


def test_every_relative_link_resolves_to_a_file_and_heading_of_the_clone():
    broken = []
    for path in DOC_FILES:
        text = FENCE.sub("", path.read_text())
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                continue  # http(s), mailto: not a file of the clone
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists() or ROOT not in resolved.parents and resolved != ROOT:
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file in the repository)")
                continue
            if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def _built_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## How it is built")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_how_it_is_built_table_names_every_top_level_folder():
    section = _built_section()
    folders = sorted(p.name for p in ROOT.iterdir()
                     if p.is_dir() and not p.name.startswith(".") and p.name not in NOT_SHIPPED
                     and not p.name.endswith(".egg-info") and p.name != "__pycache__")
    missing = [f for f in folders if f"`{f}/" not in section]
    assert not missing, f"README 'How it is built' does not describe: {missing}"
    assert "not built yet" not in section
