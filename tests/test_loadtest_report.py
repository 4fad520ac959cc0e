"""Load test runs in the product: ``manage.py loadtest`` stores the run and its report, traces every
request into the server, and ``/loadtests/<id>/`` shows the charts' data, project-scoped and escaped."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from demo.simulator import SimulatorConfig, serve
from loadtests.models import LoadTestRun
from loadtests.services import load_test_run_create, load_test_run_finish
from store import get_store
from tracedash_sdk.loadtest import LoadTest, RequestMix, StepPlan, Target

SATURATING = dict(queue_delay_ms=0.0, prefill_ms=52.5, prefill_ms_per_token=0.0, decode_ms_per_token=2.5,
                  capacity=4, load_slowdown=0.0, jitter=0.0)
EVIL = '<script>alert("x")</script>'


@pytest.fixture(scope="module")
def step_report():
    """A real step test report: 100 ms requests on 4 slots (40 rps), steps of 7.5 qps, 1.5 s each."""
    with serve(SimulatorConfig(**SATURATING)) as sim:
        return LoadTest(target=Target(sim.base_url), plan=StepPlan(37.5, 1.5), drain_timeout=1.0,
                        mix=RequestMix.single(model="sim-gpt", max_tokens=20)).run()


def _figure(html: str, element_id: str) -> dict:
    start = html.index(f'<script id="{element_id}" type="application/json">') + len(
        f'<script id="{element_id}" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


@pytest.mark.django_db
def test_report_page_shows_the_charts_data_and_the_knee(client, make_user, project_with_key, step_report):
    user = make_user()
    project, _ = project_with_key(members=[user])
    report = dict(step_report, errors_by_kind={})
    report["totals"] = dict(report["totals"], errors_by_kind={EVIL: 3})
    run = load_test_run_create(project=project, run_id=report["run_id"], test_type="step", target_url=EVIL, config={})
    load_test_run_finish(run=run, report=report)
    client.force_login(user)

    page = client.get(f"/loadtests/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert EVIL not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "vendor/plotly.min.js" in html and "tracedash/charts.js" in html

    throughput = _figure(html, "fig-throughput")
    offered = next(t for t in throughput["data"] if t["name"] == "offered QPS")
    achieved = next(t for t in throughput["data"] if t["name"] == "achieved RPS")
    assert offered["y"] == [s["offered_qps"] for s in report["steps"]]
    assert achieved["y"] == [s["achieved_rps"] for s in report["steps"]]
    knee = report["knee"]
    marker = next(t for t in throughput["data"] if t["name"] == "knee")
    assert marker["x"] == [knee["label"]] and marker["y"] == [knee["achieved_rps"]]
    latency = _figure(html, "fig-latency")
    names = {t["name"] for t in latency["data"]}
    assert {"E2E P50", "E2E P95", "E2E P99", "TTFT P50", "TTFT P95", "knee"} <= names
    p95 = next(t for t in latency["data"] if t["name"] == "E2E P95")
    assert p95["y"] == [s["e2e_ms"]["p95"] for s in report["steps"]]
    errors = _figure(html, "fig-errors")
    assert errors["data"][0]["y"] == [s["error_rate"] * 100 for s in report["steps"]]
    assert _figure(html, "fig-timeline")["data"][0]["name"] == "offered QPS"
    assert f"Knee at <strong>{knee['label']}</strong>" in html

    as_json = client.get(f"/loadtests/{run.pk}/report.json")
    assert as_json.status_code == 200 and as_json.json()["knee"] == knee

    listing = client.get("/loadtests/")
    assert listing.status_code == 200 and f"/loadtests/{run.pk}/" in listing.content.decode()


@pytest.mark.django_db
def test_burst_report_page_marks_the_recovery(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    from tracedash_sdk.loadtest import BurstPlan

    # As in test_loadtest_generator's burst test: requests of about a second on 40 slots, so a busy
    # machine's timer delays stay well inside the 10 % recovery tolerance; a baseline at under a third
    # of the capacity, so the backlog drains well within the recovery phase on a slower machine too.
    with serve(SimulatorConfig(**{**SATURATING, "prefill_ms": 1000.0, "capacity": 40})) as sim:
        report = LoadTest(target=Target(sim.base_url), plan=BurstPlan(12.0, baseline_s=3.0, ramp_s=1.0, hold_s=1.5,
                                                                      recover_s=9.0, factor=5.0), window=1.0,
                          mix=RequestMix.single(model="sim-gpt", max_tokens=20)).run()
    assert report["burst"]["recovered"]
    run = load_test_run_create(project=project, run_id=report["run_id"], test_type="burst", target_url="x", config={})
    load_test_run_finish(run=run, report=report)
    client.force_login(user)
    html = client.get(f"/loadtests/{run.pk}/").content.decode()
    timeline = _figure(html, "fig-timeline")
    texts = [a.get("text", "") for a in timeline["layout"].get("annotations", [])]
    assert f"recovered after {report['burst']['recovery_s']:.2f} s" in texts
    assert "burst" in texts
    assert f"{report['burst']['recovery_s']:.2f} s" in html  # the KPI


@pytest.mark.django_db
def test_other_users_get_404(client, make_user, project_with_key):
    owner, stranger = make_user(), make_user()
    project, _ = project_with_key(members=[owner])
    project_with_key(members=[stranger])
    run = load_test_run_create(project=project, run_id="r-secret", test_type="step", target_url="http://x", config={})
    client.force_login(stranger)
    assert client.get(f"/loadtests/{run.pk}/").status_code == 404
    assert client.get(f"/loadtests/{run.pk}/report.json").status_code == 404
    assert "r-secret" not in client.get("/loadtests/").content.decode()
    client.logout()
    assert client.get(f"/loadtests/{run.pk}/").status_code == 302  # to the login page
    client.force_login(owner)
    page = client.get(f"/loadtests/{run.pk}/")
    assert page.status_code == 200 and "No report yet" in page.content.decode()
    missing = client.get(f"/loadtests/{run.pk}/report.json")
    assert missing.status_code == 409 and missing.json()["error"]["code"] == "not_ready"


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_command_stores_the_run_and_traces_every_request(asgi_server, project_with_key, tmp_path, capsys):
    project, key = project_with_key(name="lt-project")
    out = tmp_path / "report.json"
    with serve(SimulatorConfig.instant(decode_ms_per_token=1.0)) as sim:
        call_command("loadtest", "--target", sim.base_url, "--test-type", "step", "--qps", "20", "--step-duration", "0.5",
                     "--max-steps", "2", "--project", "lt-project", "--tracedash-endpoint", asgi_server.url,
                     "--tracedash-api-key", key, "--json", str(out), "--quiet")
    printed = capsys.readouterr().out
    run = LoadTestRun.objects.get()
    assert run.project == project and run.status == "completed" and run.test_type == "step"
    assert run.report["run_id"] == run.run_id and json.loads(out.read_text()) == run.report
    assert f"/loadtests/{run.pk}/" in printed and "offered" in printed
    planned = run.report["totals"]["planned"]
    assert planned == 5 + 7
    assert run.report["config"]["tracing"]["exporter"]["spans_sent"] == 2 * planned
    assert key not in json.dumps(run.config) and key not in json.dumps(run.report)  # the ingest key is not kept
    assert run.config["qps"] == 20 and run.config["test_type"] == "step"
    rows = get_store().query(
        "SELECT attributes['loadtest.step'] AS step, count() FROM spans FINAL WHERE project_id = {p:UInt64} "
        "AND attributes['loadtest.run_id'] = {r:String} AND parent_span_id = '' GROUP BY step ORDER BY step",
        {"p": project.pk, "r": run.run_id}, tag="tests.loadtest").rows
    assert rows == [("0", 5), ("1", 7)]


@pytest.mark.django_db
def test_command_refuses_bad_options(project_with_key):
    project_with_key(name="p1")
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--test-type mixed needs --scenario"):
        call_command("loadtest", "--target", "http://127.0.0.1:9/v1", "--test-type", "mixed", "--no-trace", "--quiet")
    with pytest.raises(CommandError, match="no project named 'nope'"):
        call_command("loadtest", "--project", "nope", "--no-trace")
    assert not LoadTestRun.objects.exists()
