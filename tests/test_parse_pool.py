"""Native JSON batches parsed in worker processes (ingest.parse_pool, TRACEDASH_INGEST_PARSE_PROCESSES):
the same columns, rejections and errors as the server's own parse, Arrow columns that turn back into
exactly the parsed rows (the spool writes them out as rows), a broken pool that falls back to the
in-process parse, and the endpoint storing what a worker parsed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from ingest.parse_pool import ParsePool
from ingest.schemas import SPAN_COLUMNS, SPAN_TYPES, EnvelopeError, Limits, TooManyItems, parse_span_columns
from store import Columns, get_store
from store.backends import arrow_table
from tests.spans import llm_trace

def _body(spans) -> bytes:
    return json.dumps({"spans": spans}).encode()


def _varied() -> list[dict]:
    """Spans with everything a column can hold: events with attributes, resource attributes,
    missing tokens and TTFT, a non-string attribute, an error."""
    spans = llm_trace() + llm_trace(error=True)
    spans[1]["events"] = [{"name": "retry", "time": spans[1]["start_time"] + 5, "attributes": {"n": 2}},
                          {"name": "token", "time": spans[1]["start_time"] + 9}]
    spans[2]["resource_attributes"] = {"host.name": "gpu-7", "k8s.pod": "p-1"}
    spans[3]["attributes"] = {**spans[3].get("attributes", {}), "temperature": 0.5, "stream": True}
    return spans


@pytest.fixture(autouse=True)
def every_body_to_the_workers(monkeypatch):
    """The tests' bodies are small; the workers take bodies of every size here (but one test)."""
    monkeypatch.setattr("ingest.parse_pool.MIN_BODY_BYTES", 0)


@pytest.fixture(scope="module")
def pool():
    pool = ParsePool(2)
    pool.start()
    yield pool
    pool.close()


def _parse(pool, body: bytes, **kwargs):
    return asyncio.run(pool.parse(body, project_id=7, limits=Limits(), **kwargs))


def _as_rows(columns: Columns) -> list[dict]:
    return Columns({name: columns.values(name) for name in SPAN_COLUMNS}, columns.count).rows()


def test_arrow_columns_turn_back_into_the_parsed_rows():
    parsed, _ = parse_span_columns(_body(_varied()), project_id=7, limits=Limits())
    table = arrow_table(SPAN_COLUMNS, SPAN_TYPES, parsed)
    back = Columns.from_arrow(table)
    assert back.arrow and not parsed.arrow
    assert back.rows() == parsed.rows()
    # a group commit of worker-parsed and in-process parts: one batch, Arrow only where all are
    assert Columns.concat([back, back]).arrow
    mixed = Columns.concat([back, parsed, parsed.rows()])
    assert not mixed.arrow and mixed.rows() == parsed.rows() * 3


def test_a_worker_parses_as_the_server_does(pool):
    spans = _varied()
    spans.insert(2, {**spans[0], "trace_id": "not-hex"})  # rejected, by its index
    body = _body(spans)
    expected, expected_rejected = parse_span_columns(body, project_id=7, limits=Limits())
    got, rejected = _parse(pool, body)
    assert got.arrow and got.count == expected.count == len(spans) - 1
    assert rejected == expected_rejected and rejected[0]["index"] == 2
    assert _as_rows(got) == expected.rows()


def test_a_batch_with_scores_comes_back_as_lists_and_errors_as_the_server_raises_them(pool):
    spans = llm_trace()
    spans[2]["attributes"] = {**spans[2].get("attributes", {}), "tracedash.score.quality": 4}
    got, _ = _parse(pool, _body(spans))
    assert not got.arrow and got.rows() == parse_span_columns(_body(spans), project_id=7, limits=Limits())[0].rows()
    with pytest.raises(EnvelopeError) as worker_error:
        _parse(pool, b'{"spans": 3}')
    with pytest.raises(EnvelopeError) as own_error:
        parse_span_columns(b'{"spans": 3}', project_id=7, limits=Limits())
    assert (worker_error.value.code, worker_error.value.message) == (own_error.value.code, own_error.value.message)
    with pytest.raises(TooManyItems) as too_many:
        _parse(pool, _body(llm_trace()), max_items=2)
    assert (too_many.value.count, too_many.value.maximum) == (len(llm_trace()), 2)


def test_a_small_body_is_parsed_in_the_server_and_a_large_one_by_a_worker(pool, monkeypatch):
    monkeypatch.setattr("ingest.parse_pool.MIN_BODY_BYTES", 256 * 1024)
    small = _body(llm_trace())
    large = _body([span for _ in range(200) for span in llm_trace()])
    assert len(small) < 256 * 1024 <= len(large)
    assert not _parse(pool, small)[0].arrow
    got, _ = _parse(pool, large)
    assert got.arrow and _as_rows(got) == parse_span_columns(large, project_id=7, limits=Limits())[0].rows()


def test_a_broken_pool_parses_in_process_then_starts_again():
    pool = ParsePool(1)
    try:
        pool.start()
        for pid in list(pool._executor._processes):
            os.kill(pid, signal.SIGKILL)
        body = _body(llm_trace())
        got, _ = _parse(pool, body)  # the pool is broken: parsed here, the same rows
        assert not got.arrow and got.rows() == parse_span_columns(body, project_id=7, limits=Limits())[0].rows()
        again, _ = _parse(pool, body)  # a new pool
        assert again.arrow and _as_rows(again) == got.rows()
    finally:
        pool.close()
    closed, _ = _parse(pool, body)  # closed: in process
    assert not closed.arrow


@pytest.mark.django_db(transaction=True)
@pytest.mark.clickhouse
@pytest.mark.usefixtures("remembered_keys")
def test_the_endpoint_stores_what_a_worker_parsed(project_with_key, settings):
    from ingest import parse_pool as module
    from tests.test_ingest_asgi import _call

    settings.TRACEDASH_INGEST_PARSE_PROCESSES = 1
    project, raw = project_with_key()
    spans = _varied()
    try:
        status, _, body = _call("POST", "/api/v1/traces", _body(spans), {"authorization": f"Bearer {raw}"})
        assert status == 200 and json.loads(body) == {"accepted": len(spans), "rejected": []}
        assert module._pool is not None and module._pool._executor is not None  # a worker parsed it
    finally:
        module.close_parse_pool()
    stored = get_store().query(
        "SELECT span_id, attributes, resource_attributes, event_names, event_times, ttft_ns FROM spans FINAL "
        "WHERE project_id = {p:UInt64} ORDER BY span_id", {"p": project.pk}, tag="tests.parse_pool").dicts()
    expected = sorted(parse_span_columns(_body(spans), project_id=project.pk, limits=Limits())[0].rows(),
                      key=lambda r: r["span_id"])
    assert [r["span_id"] for r in stored] == [r["span_id"] for r in expected]
    for row, want in zip(stored, expected):
        assert dict(row["attributes"]) == want["attributes"]
        assert dict(row["resource_attributes"]) == want["resource_attributes"]
        assert list(row["event_names"]) == want["event_names"]
        assert row["ttft_ns"] == want["ttft_ns"]


def _children(pid: int) -> dict[int, str]:
    """The live processes ``pid`` started, and their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def test_serve_starts_its_parse_workers_and_stops_them(tmp_path):
    from tests.test_serve import Server, _free_port

    server = Server(tmp_path / "var", _free_port())
    server.env.update(TRACEDASH_INGEST_PARSE_PROCESSES="2", TRACEDASH_DEMO="0")
    server.start()
    try:
        assert "tracedash: 2 ingest parse worker process(es)" in server.output()
        started = {pid: line for pid, line in _children(server.proc.pid).items() if "multiprocessing" in line}
        workers = {pid for pid, line in started.items() if "resource_tracker" not in line}
        assert len(workers) == 2, started
        key = server.manage("create_project", "parsed").strip().splitlines()[-1]
        spans = [span for _ in range(200) for span in llm_trace()]
        body = _body(spans)
        assert len(body) >= 256 * 1024  # a worker's, not the server's
        request = urllib.request.Request(server.base + "/api/v1/traces", data=body,
                                         headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response) == {"accepted": len(spans), "rejected": []}
    finally:
        code = server.interrupt()
    assert code == 0, server.output()
    assert "tracedash: stopped." in server.output()
    # The workers are joined before the server ends; spawn's resource tracker ends when its pipe closes.
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "a parse worker outlived the server"
    deadline = time.monotonic() + 60
    while left := [pid for pid in started if Path(f"/proc/{pid}").exists()]:
        assert time.monotonic() < deadline, f"still running 60 s after the server: {[started[p] for p in left]}"
        time.sleep(0.2)
