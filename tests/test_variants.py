"""/variants/ and /variants.json: values of an attribute side by side, each difference from the
baseline with a 95 % interval and a verdict (seeded chdb data, the real Django client)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.variants_seed import S, score_row, seed_variants
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / S, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def window(t0_ns: int) -> str:
    return f"from={iso(t0_ns - 60 * S)}&to={iso(t0_ns + 700 * S)}"


def t0() -> int:
    return (time.time_ns() // S // 60 * 60 - 3600) * S


def figures(body) -> dict:
    rows = {f["metric"]: f for f in body["figures"]}
    for s in body["scores"]:
        rows.update({f["metric"]: f for f in s["figures"]})
    return rows


@pytest.fixture
def two_variants(make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    seed_variants(project.pk, t0_ns=start, fast_b=True)
    return user, project, start


def test_b_clearly_faster_is_significant_with_an_interval_excluding_zero(client, two_variants):
    user, project, start = two_variants
    client.force_login(user)
    body = client.get(f"/variants.json?{window(start)}").json()
    assert body["key"] == "llm.quantization" and body["values"] == ["fp16", "int8"]  # default: top by traffic
    assert body["verdict"] == "significant differences" and body["multiple_comparisons"] is None
    rows = figures(body)
    assert rows["Requests"]["values"] == [120, 120]
    p50 = rows["E2E P50"]
    assert p50["values"][0] == pytest.approx(1000, abs=40) and p50["values"][1] == pytest.approx(600, abs=40)
    d = p50["differences"][1]
    assert p50["differences"][0] is None  # the baseline
    assert d["method"] == "bootstrap" and d["significant"] is True and d["verdict"] == "significant"
    assert d["high"] < 0 and d["low"] < d["difference"] < d["high"]
    assert d["difference"] == pytest.approx(-400, abs=60) and d["tone"] == "better"
    assert rows["E2E P95"]["differences"][1]["significant"] is True
    # Every request's root failed 1 in 20 on both sides: no difference in the error rate.
    err = rows["Error rate"]
    assert err["values"] == [pytest.approx(5.0), pytest.approx(5.0)]
    assert err["differences"][1]["verdict"] == "not significant"
    # GPU memory of the hosts serving each variant: gpu-fp16 ~80 %, gpu-int8 ~40 %.
    mem = rows["GPU memory"]
    assert mem["values"][0] == pytest.approx(80.5, abs=1) and mem["values"][1] == pytest.approx(40.5, abs=1)
    assert mem["differences"][1]["significant"] is True and mem["differences"][1]["tone"] == "better"
    assert body["hosts"] == {"fp16": ["gpu-fp16"], "int8": ["gpu-int8"]}
    # Scores: quality mean 4.5 against 3.5 (worse), helpful a share of true.
    quality = rows["quality mean"]
    assert quality["values"][0] == pytest.approx(4.5, abs=0.1) and quality["values"][1] == pytest.approx(3.5, abs=0.1)
    assert quality["differences"][1]["method"] == "welch" and quality["differences"][1]["tone"] == "worse"
    assert rows["helpful share true"]["differences"][1]["method"] == "two-proportion z"
    by_name = {s["name"]: s for s in body["scores"]}
    assert sum(by_name["helpful"]["distributions"][0].values()) == 120
    # The page: the table, each difference with its verdict, coloured.
    page = client.get(f"/variants/?{window(start)}").content.decode()
    assert 'id="variants-table"' in page and "Significant differences found" in page
    assert 'data-metric="E2E P50"' in page and 'class="num better" data-verdict="significant"' in page


def test_identical_variants_say_no_significant_difference(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    seed_variants(project.pk, t0_ns=start, fast_b=False, values=("v1", "v2"))
    client.force_login(user)
    q = f"{window(start)}&key=llm.quantization&value=v1&value=v2"
    body = client.get(f"/variants.json?{q}").json()
    assert body["verdict"] == "no significant difference"
    rows = figures(body)
    for metric in ("E2E P50", "E2E P95", "Error rate", "Cost per request", "quality mean", "GPU memory"):
        d = rows[metric]["differences"][1]
        assert d["verdict"] == "not significant", (metric, d)
        assert d["low"] <= 0 <= d["high"]
    page = client.get(f"/variants/?{q}").content.decode()
    assert "No significant difference between the variants" in page


def test_three_variants_are_holm_corrected_and_scoped_to_the_project(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    other, _ = project_with_key(members=[user])
    start = t0()
    seed_variants(project.pk, t0_ns=start, n=40, values=("a", "b", "c"), scores=False)
    seed_variants(other.pk, t0_ns=start, n=40, values=("a", "z"), scores=False)
    client.force_login(user)
    theirs = client.get(f"/variants.json?{window(start)}&project={other.pk}").json()
    assert theirs["values"] == ["a", "z"] and figures(theirs)["Requests"]["values"] == [40, 40]
    body = client.get(f"/variants.json?{window(start)}&project={project.pk}").json()
    assert body["project_id"] == project.pk
    assert sorted(body["values"]) == ["a", "b", "c"] and "z" not in body["values"]
    assert body["multiple_comparisons"] == "holm"
    rows = figures(body)
    assert rows["Requests"]["values"] == [40, 40, 40]
    for d in rows["E2E P50"]["differences"][1:]:
        assert d["p_adjusted"] >= d["p_value"]
    assert body["scores"] == []


def test_scores_are_read_final_and_categorical_counted(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    ids = seed_variants(project.pk, t0_ns=start, n=30, scores=False)
    rows = []
    for value, label in (("fp16", "good"), ("int8", "bad")):
        for tid in ids[value]:
            rows.append(score_row(project.pk, tid, "verdict", 0, data_type="categorical", label="ok"))
    get_store().insert("scores", rows, tag="tests.variants.scores")
    # Re-sent with the same score id and a new label: replaces the first (FINAL).
    rows = [score_row(project.pk, tid, "verdict", 0, data_type="categorical", label=label)
            for value, label in (("fp16", "good"), ("int8", "bad")) for tid in ids[value]]
    get_store().insert("scores", rows, tag="tests.variants.scores")
    client.force_login(user)
    body = client.get(f"/variants.json?{window(start)}").json()
    verdict = {s["name"]: s for s in body["scores"]}["verdict"]
    assert verdict["data_type"] == "categorical"
    assert verdict["distributions"] == [{"good": 30}, {"bad": 30}]
    good = figures(body)["verdict = good"]
    assert good["values"] == [100.0, 0.0] and good["differences"][1]["significant"] is True


@pytest.mark.parametrize("query, message", [
    ("key=" + "k" * 300, "key is longer than 256"),
    ("value=a&value=" + "v" * 300, "value is longer than 256"),
    ("&".join(f"value=v{i}" for i in range(9)), "at most 8 values"),
    ("range=7y", "range"),
    ("from=yesterday&to=now", "from"),
])
def test_bad_parameters_are_a_clear_400_and_the_page_says_so(client, make_user, project_with_key, query, message):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    r = client.get(f"/variants.json?{query}")
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.content
    page = client.get(f"/variants/?{query}")
    assert page.status_code == 200 and message in page.content.decode()


def test_a_key_without_values_shows_the_empty_state_with_escaped_names(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    seed_variants(project.pk, t0_ns=start, n=5, values=("<b>x</b>", "y"), scores=False)
    client.force_login(user)
    page = client.get(f"/variants/?{window(start)}&key=no.such.key").content.decode()
    assert 'id="variants-empty"' in page and "no.such.key" in page
    page = client.get(f"/variants/?{window(start)}").content.decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    body = client.get(f"/variants.json?{window(start)}&key=no.such.key").json()
    assert body["values"] == [] and body["verdict"] == "no values" and body["figures"] == []


def test_a_trace_carrying_two_values_counts_once_under_its_earliest_spans(client, make_user, project_with_key):
    from tests.explorer_seed import seed_traces
    from tests.variants_seed import variant_trace

    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    seed_variants(project.pk, t0_ns=start, n=10, scores=False)
    mixed = variant_trace(start + 30 * S, value="int8", e2e_ms=900, host="gpu-x")
    mixed[1]["attributes"] = {"llm.quantization": "fp16"}  # the network span starts first
    mixed[2]["resource_attributes"] = {"llm.quantization": "", "host.name": "gpu-x"}  # empty: no value
    seed_traces(project_id=project.pk, traces=[mixed])
    client.force_login(user)
    body = client.get(f"/variants.json?{window(start)}&value=fp16&value=int8").json()
    assert figures(body)["Requests"]["values"] == [11, 10]


def test_the_attribute_index_gives_the_same_figures_and_hosts_as_the_span_scan(client, two_variants):
    """The first read scans the spans and declares the key (and, having found GPU samples,
    ``host.name``); once both are backfilled the same read comes from the attribute index."""
    from analytics import attribute_index

    user, project, start = two_variants
    client.force_login(user)
    scanned = client.get(f"/variants.json?{window(start)}").json()
    keys = attribute_index.indexed_keys(project_id=project.pk)
    assert sorted(k.key for k in keys) == ["host.name", "llm.quantization"] and not any(k.ready for k in keys)
    attribute_index.index_backfill(project_ids=[project.pk], delay_seconds=0)
    assert all(k.ready for k in attribute_index.indexed_keys(project_id=project.pk))
    indexed = client.get(f"/variants.json?{window(start)}").json()
    assert indexed["hosts"] == scanned["hosts"] == {"fp16": ["gpu-fp16"], "int8": ["gpu-int8"]}
    assert {m: f["values"] for m, f in figures(indexed).items()} == {m: f["values"] for m, f in figures(scanned).items()}
    assert figures(indexed)["GPU memory"]["values"][1] == pytest.approx(40.5, abs=1)


def test_membership_matches_numpys():
    import numpy as np

    from analytics.variants import _members

    rng = np.random.default_rng(3)
    values = rng.integers(0, 1 << 40, 5000, dtype=np.uint64)
    for of in (values[:0], values[:1], rng.choice(values, 700), rng.integers(0, 1 << 40, 900, dtype=np.uint64),
               np.array([np.iinfo(np.uint64).max], dtype=np.uint64)):
        assert (_members(values, of) == np.isin(values, of)).all()


def test_host_name_as_the_variant_key_gives_each_host_its_own_gpu(client, two_variants):
    """``host.name`` may itself be the variant key (one host per deployment): the key's rows and the
    hosts' rows are then the same rows, read once for the value and once for the GPU minutes — from
    the spans, then from the index, with the same figures."""
    from analytics import attribute_index

    user, project, start = two_variants
    client.force_login(user)
    url = f"/variants.json?{window(start)}&key=host.name&value=gpu-fp16&value=gpu-int8"
    scanned = client.get(url).json()
    attribute_index.index_backfill(project_ids=[project.pk], delay_seconds=0)
    assert all(k.ready for k in attribute_index.indexed_keys(project_id=project.pk))
    indexed = client.get(url).json()
    assert indexed["hosts"] == scanned["hosts"] == {"gpu-fp16": ["gpu-fp16"], "gpu-int8": ["gpu-int8"]}
    assert {m: f["values"] for m, f in figures(indexed).items()} == {m: f["values"] for m, f in figures(scanned).items()}
    assert figures(indexed)["Requests"]["values"] == [120, 120]
    assert figures(indexed)["GPU memory"]["values"][0] == pytest.approx(80.5, abs=1)
    assert figures(indexed)["GPU memory"]["values"][1] == pytest.approx(40.5, abs=1)


def test_gpu_samples_but_spans_naming_no_host_still_read_the_index(client, make_user, project_with_key):
    """GPU samples in the window while the spans name no host (the agent samples the machine, the app
    never sets host.name): ``host.name`` is declared anyway, so once both keys are backfilled the
    read comes from the index; no GPU figure, no host, the same request figures as the scan."""
    from analytics import attribute_index
    from tests.explorer_seed import seed_traces
    from tests.variants_seed import variant_trace
    from tests.alerts_support import sample

    user = make_user()
    project, _ = project_with_key(members=[user])
    start = t0()
    traces = [variant_trace(start + i * S, value=("fp16", "int8")[i % 2], e2e_ms=500 + i, host="") for i in range(20)]
    for spans in traces:
        for span in spans:
            span["resource_attributes"] = {}
    seed_traces(project_id=project.pk, traces=traces)
    get_store().insert("resource_samples", [sample(project.pk, datetime.fromtimestamp(start / S + 65, tz=timezone.utc),
                                                   host="gpu-a", mem_pct=50.0, util=50.0)], tag="tests.variants.samples")
    client.force_login(user)
    url = f"/variants.json?{window(start)}&value=fp16&value=int8"
    scanned = client.get(url).json()
    assert sorted(k.key for k in attribute_index.indexed_keys(project_id=project.pk)) == ["host.name", "llm.quantization"]
    attribute_index.index_backfill(project_ids=[project.pk], delay_seconds=0)
    assert all(k.ready for k in attribute_index.indexed_keys(project_id=project.pk))
    indexed = client.get(url).json()
    assert indexed["hosts"] == scanned["hosts"] == {"fp16": [], "int8": []}
    assert {m: f["values"] for m, f in figures(indexed).items()} == {m: f["values"] for m, f in figures(scanned).items()}
    assert figures(indexed)["Requests"]["values"] == [10, 10]
    assert figures(indexed)["GPU memory"]["values"] == [None, None]
    # A row only the index holds (an int8 trace given an earlier fp16 value) shows where the read comes from.
    moved = traces[1][0]["trace_id"]
    get_store().insert("span_key_values", [{"project_id": project.pk, "key": "llm.quantization", "value": "fp16",
                                            "trace_id": moved, "start_time": start - 2 * S}], tag="tests.variants.index")
    assert figures(client.get(url).json())["Requests"]["values"] == [11, 9]
