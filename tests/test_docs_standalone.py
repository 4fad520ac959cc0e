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


def _span(span_id, parent, phase, start_ms, end_ms):
    return {"span_id": span_id, "parent_span_id": parent, "phase": phase, "name": span_id, "service": "s", "model": "",
            "start_ns": start_ms * 10**6, "duration_ns": (end_ms - start_ms) * 10**6, "status": "ok"}


def test_the_documented_phase_overlap_example_is_what_the_product_computes():
    """docs/definitions.md "Which phase owns an instant": its example and its orphan rule."""
    from analytics.trace_math import phase_times

    spans = [_span("root", "", "other", 0, 1000), _span("prep", "root", "preprocess", 0, 300),
             _span("llm", "root", "inference", 200, 900)]
    ms = {phase: ns / 10**6 for phase, ns in phase_times(spans).items() if ns}
    assert ms == {"preprocess": 200, "inference": 700, "other": 100}
    text = (ROOT / "docs" / "definitions.md").read_text()
    assert "preprocess 200 ms, inference\n700 ms, other 100 ms" in text or "preprocess 200 ms, inference 700 ms, other 100 ms" in text
    # The order: network over preprocess over postprocess over other, each a parallel sibling.
    for winner, loser in (("network", "preprocess"), ("preprocess", "postprocess"), ("postprocess", "other"),
                          ("inference", "network")):
        both = [_span("root", "", "other", 10, 60), _span("a", "root", winner, 10, 60), _span("b", "root", loser, 10, 60)]
        assert phase_times(both)[winner] == 50 * 10**6 and phase_times(both)[loser] == 0
    # The root's own time ranks last: an orphan (parent never arrived) takes the instants it covers.
    orphan = [_span("root", "", "inference", 0, 100), _span("lost", "ffffffffffffffff", "postprocess", 20, 50)]
    assert phase_times(orphan)["postprocess"] == 30 * 10**6 and phase_times(orphan)["inference"] == 70 * 10**6
