"""docs/engines.md names every canonical engine metric with its kind, and every source metric family
the catalogue maps (``agent.engines``): the documented catalogue cannot drift from the code's."""

from __future__ import annotations

import re
from pathlib import Path

from agent.engines import METRICS, SOURCES, family_name

DOC = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()


def _catalogue_rows() -> dict[str, list[str]]:
    start = DOC.index("| metric | kind | what it is |")
    rows = {}
    for line in DOC[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def test_every_canonical_metric_is_a_row_with_its_kind():
    rows = _catalogue_rows()
    assert list(rows) == list(METRICS)
    assert {metric: cells[1].split(",")[0] for metric, cells in rows.items()} == {m: kind for m, (kind, _) in METRICS.items()}


def test_every_source_name_is_in_the_row_of_the_metric_it_maps_to():
    rows = _catalogue_rows()
    engine_columns = {"vllm": (3, 4), "tgi": (5,), "sglang": (6,), "trtllm": (7,)}
    for source, (engine, metric, _scale) in SOURCES.items():
        cells = [rows[metric][i] for i in engine_columns[engine]]
        assert any(re.search(rf"`{re.escape(source)}(_total)?`", c) for c in cells), (source, metric)
    named = {family_name(n) for n in re.findall(r"`((?:vllm:|tgi_|sglang:|trtllm_|trtllm:)\w+)`", DOC)}
    assert named <= set(SOURCES), f"documented names the catalogue does not map: {sorted(named - set(SOURCES))}"
