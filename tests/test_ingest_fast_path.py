"""The native batch's fast path (one typed decode of the whole body) must give exactly the rows of
the per-item path, and hand every batch it cannot take to that path."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.schemas import (SPAN_COLUMNS, BatchIn, Limits, decode_envelope, parse_span, parse_span_columns,
                            parse_spans)
from store.schema import SPANS

LIMITS = Limits(max_attributes=16, max_key_bytes=64, max_value_bytes=400)


def _per_item(body: bytes, limits: Limits = LIMITS) -> tuple[list, list]:
    rows, rejected = [], []
    for index, raw in enumerate(decode_envelope(body, BatchIn, name="spans")):
        try:
            rows.append(parse_span(raw, project_id=7, limits=limits))
        except Exception as exc:  # FieldError
            rejected.append({"index": index, "field": exc.field, "message": exc.message})
    return rows, rejected


def _span(i: int, **extra) -> dict:
    return {"trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}", "name": f"op {i}",
            "start_time": 1_767_225_600_000_000_000 + i, "duration_ms": 1.5, **extra}


def _body(spans: list[dict]) -> bytes:
    return json.dumps({"spans": spans}, ensure_ascii=False).encode()


scalars = st.one_of(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False))
flat_maps = st.dictionaries(st.text(min_size=1, max_size=12), scalars, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(flat_maps, flat_maps, st.sampled_from([None, "network", "inference"]),
                          st.one_of(st.none(), st.floats(0, 5000))), min_size=1, max_size=8))
def test_fast_path_rows_equal_per_item_rows(items):
    spans = []
    for i, (attributes, resource, phase, ttft) in enumerate(items):
        span = _span(i, attributes=attributes, resource_attributes=resource)
        if phase:
            span["phase"] = phase
        if ttft is not None:
            span["ttft_ms"] = ttft
        spans.append(span)
    body = _body(spans)
    assert parse_spans(body, project_id=7, limits=LIMITS) == _per_item(body)


def test_values_past_the_fast_bound_but_within_the_byte_limit_are_accepted():
    # 101 ASCII characters: over the fast path's 400 // 4 characters, within 400 bytes.
    body = _body([_span(0, attributes={"prompt": "x" * 101}), _span(1)])
    rows, rejected = parse_spans(body, project_id=7, limits=LIMITS)
    assert not rejected and rows[0]["attributes"] == {"prompt": "x" * 101}
    assert (rows, rejected) == _per_item(body)


def test_nested_and_list_values_are_flattened_as_before():
    body = _body([_span(0, attributes={"a": {"b": 1, "c": [1, "x"]}, "d": True})])
    rows, rejected = parse_spans(body, project_id=7, limits=LIMITS)
    assert not rejected and rows[0]["attributes"] == {"a.b": "1", "a.c": '[1,"x"]', "d": "true"}


def test_an_invalid_span_is_rejected_by_index_and_the_rest_kept():
    body = _body([_span(0), _span(1, trace_id="XYZ"), _span(2, end_time=1, duration_ms=None)])
    rows, rejected = parse_spans(body, project_id=7, limits=LIMITS)
    assert [r["span_id"] for r in rows] == [f"{1:016x}"]
    assert [r["index"] for r in rejected] == [1, 2]
    assert rejected[0]["field"] == "trace_id" and rejected[1]["field"] == "end_time"
    assert (rows, rejected) == _per_item(body)


def test_checks_outside_msgspec_reject_by_index_on_the_fast_path_too():
    # Valid for the typed decode, refused by the Python checks: all-zero ids, own parent.
    body = _body([_span(0, span_id="0" * 16), _span(1, parent_span_id=f"{2:016x}"), _span(2)])
    rows, rejected = parse_spans(body, project_id=7, limits=LIMITS)
    assert [r["index"] for r in rejected] == [0, 1]
    assert (rows, rejected) == _per_item(body)


def test_the_columns_handed_to_the_writer_are_the_per_item_rows_column_by_column():
    """``parse_span_columns`` (what the endpoint hands the writer) holds exactly the per-item path's
    rows, as list columns of every column an insert into ``spans`` needs, on the fast path and on the
    per-item one (a nested value sends the batch there)."""
    spans = [_span(0, attributes={"a": 1}), _span(1, parent_span_id="0" * 16), _span(2, phase="inference")]
    for extra in ({}, {"attributes": {"nested": {"x": 1}}}):
        spans[0].update(extra)
        body = _body(spans)
        columns, rejected = parse_span_columns(body, project_id=7, limits=LIMITS)
        rows, expected_rejected = _per_item(body)
        assert rejected == expected_rejected and [r["index"] for r in rejected] == [1]
        assert len(columns) == len(rows) == 2
        assert {name: columns.column(name) for name in SPAN_COLUMNS} == {
            name: [row[name] for row in rows] for name in SPAN_COLUMNS}
        assert all(type(columns.column(name)) is list for name in SPAN_COLUMNS)
    assert set(SPAN_COLUMNS) == {c.name for c in SPANS.insert_columns}
    empty, rejected = parse_span_columns(_body([_span(0, name=" ")]), project_id=7, limits=LIMITS)
    assert len(empty) == 0 and rejected[0]["field"] == "name"
