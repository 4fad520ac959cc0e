"""Seeding for the panel page tests: spans and their summaries (``tests.explorer_seed``), then
the rollups of the days they fall in, recomputed by the service the rollup task runs."""

from __future__ import annotations

from analytics.rollup_services import rollups_rebuild
from tests.explorer_seed import seed_traces


def seed_rolled_up(*, project_id: int, traces: list[list[dict]]) -> list[str]:
    ids = seed_traces(project_id=project_id, traces=traces)
    starts = [int(span["start_time"]) for spans in traces for span in spans]
    rollups_rebuild(project_id=project_id, from_ns=min(starts), to_ns=max(starts) + 1)
    return ids
