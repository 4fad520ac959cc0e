"""Writes of ingested data, and the live event that follows them.

Resource samples take one path whoever sends them: an agent over ``POST /api/v1/resources``
(``ingest.views``) or the embedded server sampling its own host (``agent.tasks``) are both
validated by ``samples_validate``, written through the process's group-commit writer
(ClickHouse, or the fsync'd spool when it cannot take them) and announced with the same
``resources.ingested`` event."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

import msgspec
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from config.live import group_send, nobody_listens
from store import column_values

from .schemas import SamplesIn, decode_envelope, parse_each, parse_engine_sample, parse_resource_sample
from .writer import Outcome, current_writer, get_writer

# Live events are best-effort: a Redis that accepts connections but answers nothing (frozen,
# overloaded) must not hold up the acknowledgement of data that is already stored.
LIVE_SEND_TIMEOUT_SECONDS = 0.5

log = logging.getLogger("tracedash.ingest")


def traces_group(project_id: int) -> str:
    return f"project-{int(project_id)}-traces"


def _event(rows) -> dict:
    ids = column_values(rows, "trace_id")
    trace_ids = sorted(ids.unique().to_pylist() if hasattr(ids, "unique") else set(ids))
    return {"type": "traces.ingested", "spans": len(rows), "trace_ids": trace_ids[:100]}


def _resources_event(rows: list[dict]) -> dict:
    """Resource and engine samples both: the Resources and Engines pages refresh on it."""
    hosts = sorted({str(row["host"]) for row in rows})
    return {"type": "resources.ingested", "samples": len(rows), "hosts": hosts[:100]}


def spans_ingest(*, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated span rows of one project (synchronous callers), then announce them."""
    if not rows:
        return None
    outcome = get_writer().write("spans", rows)
    async_to_sync(traces_notify_async)(project_id=project_id, rows=rows, later=False)
    return outcome


# Live events waiting for the journal's insert (strong references: the loop keeps only weak ones).
_DEFERRED: set[asyncio.Task] = set()
JOURNAL_WAIT_SECONDS = 30.0  # a journal insert taking longer than this is announced anyway


async def traces_notify_async(*, project_id: int, rows: list[dict], later: bool = True) -> None:
    """Tell open dashboards which traces grew; a live-update failure is logged and never turns
    into an API error. The event makes a page read the store, so it goes once the spans are
    readable: at once for spans stored before their answer, after the journal's next insert for
    journaled ones (``IngestWriter.journal_barrier``): in a task of its own when ``later`` (the
    answer does not wait), else awaited here."""
    if not rows:
        return
    try:
        layer = get_channel_layer()
        group = traces_group(project_id)
        if layer is None or nobody_listens(layer, group):
            return
        writer = current_writer()
        barrier = writer.journal_barrier() if writer is not None else None
        if barrier is not None and later:
            task = asyncio.get_running_loop().create_task(_traces_send(layer, group, rows, project_id, barrier))
            _DEFERRED.add(task)
            task.add_done_callback(_DEFERRED.discard)
        else:
            await _traces_send(layer, group, rows, project_id, barrier)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live update for project %s failed", project_id)


async def _traces_send(layer, group: str, rows, project_id: int, barrier=None) -> None:
    try:
        if barrier is not None:
            try:
                # Shielded: a wait given up must not cancel the batch's future other events wait on.
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(barrier)), JOURNAL_WAIT_SECONDS)
            except asyncio.TimeoutError:
                log.warning("live update for project %s sent before the journal's insert, which took over %.0f s",
                            project_id, JOURNAL_WAIT_SECONDS)
        await asyncio.wait_for(layer.group_send(group, _event(rows)), LIVE_SEND_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live update for project %s failed", project_id)


async def resources_notify_async(*, project_id: int, rows: list[dict]) -> None:
    """Tell open dashboards that resource samples of these hosts arrived (same group as traces;
    a live-update failure is logged, never an API error)."""
    if not rows:
        return
    try:
        layer = get_channel_layer()
        group = traces_group(project_id)
        if layer is not None and not nobody_listens(layer, group):
            await asyncio.wait_for(layer.group_send(group, _resources_event(rows)), LIVE_SEND_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live resources update for project %s failed", project_id)


def resources_notify(*, project_id: int, rows: list[dict]) -> None:
    """``resources_notify_async`` for synchronous callers (the embedded sampler task)."""
    if rows:
        group_send(traces_group(project_id), _resources_event(rows), wait=False)


@dataclass(frozen=True)
class SampleKind:
    """A native batch of samples (``{"samples": [...]}``): the table it is stored in and the parser
    of one sample (a row, or a FieldError naming what is wrong)."""

    table: str
    parse: Callable


RESOURCE_SAMPLES = SampleKind("resource_samples", parse_resource_sample)  # POST /api/v1/resources
ENGINE_SAMPLES = SampleKind("engine_samples", parse_engine_sample)  # POST /api/v1/engine_samples


def samples_validate(kind: SampleKind, items: list, *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Raw samples of a batch -> (rows, rejected), a rejection naming the sample's index, field and
    what is wrong (the endpoint answers with the same list)."""
    return parse_each(items, lambda item: kind.parse(item, project_id=project_id))


async def samples_store_async(kind: SampleKind, *, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated sample rows of one project through the writer, then announce them (resource
    and engine samples both as ``resources.ingested``). The writer's refusals (``Overloaded``,
    ``SpoolFull``, a store error) are raised to the caller."""
    if not rows:
        return None
    outcome = await get_writer().submit_async(kind.table, rows)
    await resources_notify_async(project_id=project_id, rows=rows)
    return outcome


def samples_ingest(kind: SampleKind, *, project_ids: list[int],
                   samples: list[dict]) -> dict[int, tuple[list[dict], list[dict]]]:
    """The endpoint's ingestion for a synchronous caller in this process (the embedded server sampling
    its host for every project, ``agent.sampler.sample_payload``, and scraping engines,
    ``agent.engines``): ``samples`` as the endpoint's JSON objects are validated for each of
    ``project_ids`` by the same parser, stored through the same writer in one insert for them all
    (waiting for it, like a request; an insert has a fixed cost of ~12 ms of CPU on chdb, whatever
    its rows) and announced to each project with the same event (sent onto the serving loop,
    ``config.live``). Returns {project: (rows stored, rejected)}."""
    items = decode_envelope(msgspec.json.encode({"samples": samples}), SamplesIn, name="samples")
    outcome = {pid: samples_validate(kind, items, project_id=pid) for pid in project_ids}
    rows = [row for stored, _ in outcome.values() for row in stored]
    if rows:
        get_writer().write(kind.table, rows)
        for pid, (stored, _) in outcome.items():
            if stored:
                resources_notify(project_id=pid, rows=stored)
    return outcome


# --- scores (POST /api/v1/scores, the SDK, OTel attributes, the trace page's review form) -------
def _scores_event(rows: list[dict]) -> dict:
    trace_ids = sorted({row["trace_id"] for row in rows})
    return {"type": "scores.ingested", "scores": len(rows), "trace_ids": trace_ids[:100]}


def scores_validate(items: list, *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Raw scores of a batch -> (rows, rejected), as ``samples_validate``."""
    from .scores import parse_score

    return parse_each(items, lambda item: parse_score(item, project_id=project_id))


async def scores_store_async(*, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated score rows of one project through the writer (ClickHouse or the fsync'd
    spool); the writer's refusals are raised to the caller."""
    if not rows:
        return None
    return await get_writer().submit_async("scores", rows)


def scores_ingest(*, project_id: int, scores: list[dict], default_source: str = "api") -> tuple[list[dict], list[dict]]:
    """The endpoint's ingestion for a synchronous caller in this process (the trace page's review
    form): each score as the endpoint's JSON object, checked by the same parser and stored through
    the same writer (waiting for it). Returns (rows stored, rejected)."""
    from .scores import score_row
    from .schemas import FieldError

    rows, rejected = [], []
    for index, score in enumerate(scores):
        try:
            rows.append(score_row(score, project_id=project_id, default_source=default_source))
        except FieldError as exc:
            rejected.append({"index": index, "field": exc.field, "message": exc.message})
    if rows:
        get_writer().write("scores", rows)
    return rows, rejected
