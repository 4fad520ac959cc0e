"""A JSON number with an integral value is a whole number, whatever its notation (``70e9``, ``1.0``,
``812.0``): every integer field of the native formats and of OTLP JSON takes it, on the fast and the
per-item path alike, and a fraction (``70.5``) is refused naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import otlp
from ingest.schemas import BatchIn, FieldError, Limits, decode_envelope, parse_resource_sample, parse_span, parse_spans

LIMITS = Limits()
START = 1_764_504_000_123_456_789  # above 2**53: a float of it is not exact


def _per_item(body: bytes) -> tuple[list, list]:
    rows, rejected = [], []
    for index, raw in enumerate(decode_envelope(body, BatchIn, name="spans")):
        try:
            rows.append(parse_span(raw, project_id=7, limits=LIMITS))
        except FieldError as exc:
            rejected.append({"index": index, "field": exc.field, "message": exc.message})
    return rows, rejected


def _both(body: bytes) -> tuple[list, list]:
    """The fast path's answer, checked equal to the per-item path's."""
    answer = parse_spans(body, project_id=7, limits=LIMITS)
    assert answer == _per_item(body)
    return answer


def _notations(n: int) -> list[str]:
    """Ways JSON can write the whole number n (all exact)."""
    digits = str(n)
    out = [digits, f"{digits}.0", f"{digits}e0", f"{digits}.000E+0"]
    if len(digits) > 1:
        out.append(f"{digits[0]}.{digits[1:]}e{len(digits) - 1}")
    return out


def _span_text(start: str, end: str, tokens_in: str, tokens_out: str, event_time: str, i: int = 0) -> str:
    return ('{"trace_id": "%032x", "span_id": "%016x", "name": "llm.chat", "phase": "inference", '
            '"start_time": %s, "end_time": %s, "input_tokens": %s, "output_tokens": %s, '
            '"events": [{"name": "first_token", "time": %s}]}' % (i + 1, i + 1, start, end, tokens_in, tokens_out,
                                                                    event_time))


def test_the_integer_fields_of_a_span_take_any_notation_of_a_whole_number():
    plain = _span_text(str(START), str(START + 940_000_000), "812", "164", str(START + 210_000_000))
    written = _span_text(f"{START}.0", "1.764504001063456789e18", "812.0", "1.64e2", f"{START + 210_000_000}E0")
    expected, rejected = _both(('{"spans": [%s]}' % plain).encode())
    assert not rejected
    rows, rejected = _both(('{"spans": [%s]}' % written).encode())
    assert not rejected and rows == expected
    assert rows[0]["start_time"] == START and rows[0]["input_tokens"] == 812 and rows[0]["output_tokens"] == 164
    assert rows[0]["event_times"] == [START + 210_000_000] and type(rows[0]["input_tokens"]) is int


@pytest.mark.parametrize("field, value, named", [
    ("input_tokens", "70.5", "input_tokens"),
    ("output_tokens", "1.5e0", "output_tokens"),
    ("start_time", f"{START}.5", "start_time"),
    ("end_time", "1764504001.5e9", "end_time"),  # 1764504001500000000: whole, accepted
    ("end_time", "1.76450400150000000025e18", "end_time"),
])
def test_a_fraction_is_refused_naming_the_field_on_both_paths(field, value, named):
    span = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "name": "x",
            "start_time": START, "end_time": START + 10**9}
    text = json.dumps(span).replace(f'"{field}": {span.get(field, 0)}', f'"{field}": {value}')
    if field not in span:
        text = text[:-1] + f', "{field}": {value}}}'
    good = json.dumps(dict(span, span_id="00f067aa0ba902b8"))
    rows, rejected = _both(('{"spans": [%s, %s]}' % (text, good)).encode())
    if value == "1764504001.5e9":
        assert not rejected and rows[0]["duration_ns"] == 1764504001500000000 - START
        return
    assert [r["span_id"] for r in rows] == ["00f067aa0ba902b8"]
    assert [(r["index"], r["field"]) for r in rejected] == [(0, named)]
    assert rejected[0]["message"].startswith("expected a whole number, got ")


@settings(max_examples=120, deadline=None)
@given(st.integers(START - 10**15, START + 10**15), st.integers(0, 10**12), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.data())
def test_every_notation_gives_the_rows_of_the_plain_integer(start, duration, tokens_in, tokens_out, data):
    end = start + duration
    plain = '{"spans": [%s]}' % _span_text(str(start), str(end), str(tokens_in), str(tokens_out), str(end))
    pick = lambda n: data.draw(st.sampled_from(_notations(n)))  # noqa: E731
    written = '{"spans": [%s]}' % _span_text(pick(start), pick(end), pick(tokens_in), pick(tokens_out), pick(end))
    expected = parse_spans(plain.encode(), project_id=7, limits=LIMITS)
    assert not expected[1]
    assert _both(written.encode()) == expected


def test_the_readme_resource_sample_is_accepted_with_whole_byte_counts():
    raw = (b'{"host": "gpu-1", "time": "2026-11-30T12:00:00Z", "gpu_index": 0, "gpu_memory_used": 70e9, '
           b'"gpu_memory_total": 80e9, "gpu_utilization": 97, "processes": [{"pid": 4242, "name": "vllm", "gpu_memory": 68e9}]}')
    row = parse_resource_sample(raw, project_id=7)
    assert (row["gpu_memory_used"], row["gpu_memory_total"], row["process_gpu_memory"]) == (70 * 10**9, 80 * 10**9, [68 * 10**9])
    assert all(type(v) is int for v in (row["gpu_memory_used"], row["gpu_memory_total"], *row["process_gpu_memory"]))


def test_every_integer_field_of_a_resource_sample_takes_whole_floats_exactly():
    raw = (b'{"host": "h", "time": 1764504000123456789.0, "gpu_index": 1.0, "memory_used": 9007199254740993.0, '
           b'"memory_total": 1.8e19, "processes": [{"pid": 4242.0, "gpu_memory": 9007199254740993e0}]}')
    with pytest.raises(FieldError) as refused:  # 1.8e19 is over the byte bound
        parse_resource_sample(raw, project_id=7)
    assert refused.value.field == "memory_total"
    row = parse_resource_sample(raw.replace(b"1.8e19", b"9.1e18"), project_id=7)
    assert row["time"] == START and row["gpu_index"] == 1 and row["memory_used"] == 2**53 + 1
    assert row["memory_total"] == 9_100_000_000_000_000_000
    assert row["process_pids"] == [4242] and row["process_gpu_memory"] == [2**53 + 1]


@pytest.mark.parametrize("field, value, named", [
    ("gpu_index", "0.5", "gpu_index"), ("gpu_memory_used", "70.5", "gpu_memory_used"),
    ("time", "1764504000123456789.5", "time"), ("pid", "4242.5", "processes[0].pid"),
    ("gpu_memory", "1.5", "processes[0].gpu_memory"),
])
def test_a_fractional_sample_field_is_refused_naming_it(field, value, named):
    sample = {"host": "h", "time": START, "gpu_index": 0, "gpu_memory_used": 1, "gpu_memory_total": 2,
              "processes": [{"pid": 1, "gpu_memory": 1}]}
    text = json.dumps(sample)
    old = f'"{field}": {sample.get(field, 1)}' if field not in ("pid", "gpu_memory") else f'"{field}": 1'
    assert old in text
    with pytest.raises(FieldError) as refused:
        parse_resource_sample(text.replace(old, f'"{field}": {value}', 1).encode(), project_id=7)
    assert refused.value.field == named and refused.value.message.startswith("expected a whole number")


def _otlp_span(start: str, tokens: str) -> bytes:
    return ('{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "chat"}}]},'
            ' "scopeSpans": [{"spans": [{"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7",'
            ' "name": "chat", "kind": 3, "startTimeUnixNano": %s, "endTimeUnixNano": "%d", "attributes": ['
            '{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},'
            '{"key": "gen_ai.usage.input_tokens", "value": {"intValue": %s}},'
            '{"key": "gen_ai.usage.output_tokens", "value": {"doubleValue": %s}}]}]}]}]}'
            % (start, START + 10**9, tokens, tokens)).encode()


def test_otlp_json_integers_take_any_notation_of_a_whole_number():
    [span] = otlp.decode_traces(_otlp_span(f"{START}.0", "812.0"), "application/json")
    row = otlp.span_row(span, project_id=7, limits=LIMITS)
    assert row["start_time"] == START and row["input_tokens"] == 812 and row["output_tokens"] == 812
    [span] = otlp.decode_traces(_otlp_span("1.764504000123456789e18", "8.12e2"), "application/json")
    assert otlp.span_row(span, project_id=7, limits=LIMITS)["start_time"] == START


def test_otlp_json_fractions_are_refused_naming_the_field():
    with pytest.raises(otlp.OtlpDecodeError, match="startTimeUnixNano must be a whole number"):
        otlp.decode_traces(_otlp_span(f"{START}.5", "812"), "application/json")
    with pytest.raises(otlp.OtlpDecodeError, match="intValue must be a whole number"):
        otlp.decode_traces(_otlp_span(str(START), "812.5"), "application/json")
    body = _otlp_span(str(START), "812").replace(b'{"doubleValue": 812}', b'{"doubleValue": 164.5}')
    [span] = otlp.decode_traces(body, "application/json")
    with pytest.raises(FieldError) as refused:
        otlp.span_row(span, project_id=7, limits=LIMITS)
    assert refused.value.field == "attributes.gen_ai.usage.output_tokens"
    assert "whole number" in refused.value.message
