"""Load tests started from the Load tests page: the form's validation, one running test per
project, one reused "load tests" ingest key, the background runner (embedded: a thread) with live
progress, and the link to the run's traces."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from demo.simulator import SimulatorConfig, serve
from loadtests.models import LoadTestKey, LoadTestRun
from loadtests.runner import load_test_execute, plan_options
from loadtests.services import LOAD_TEST_KEY_NAME, load_test_key_ensure, load_test_start
from projects.models import ApiKey
from store import get_store
from tests.conftest import wait_until

GOOD = {"test_type": "concurrency", "qps": "5", "duration": "10", "target": "simulator", "target_url": "",
        "model": ""}


@pytest.fixture
def member(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    return project


@pytest.fixture
def dispatched(monkeypatch):
    """Runs handed to the background, not started (the runner has its own tests)."""
    calls = []
    monkeypatch.setattr("loadtests.services._dispatch", lambda *args: calls.append(args))
    return calls


@pytest.mark.django_db
@pytest.mark.parametrize("changes, field, message", [
    ({"qps": "0"}, "qps", "greater than or equal to 0.1"),
    ({"qps": "fast"}, "qps", "Enter a number"),
    ({"qps": "5000"}, "qps", "less than or equal to 1000"),
    ({"duration": "2"}, "duration", "greater than or equal to 10"),
    ({"test_type": "mixed"}, "test_type", "Select a valid choice"),
    ({"target": "url"}, "target_url", "the target is a URL: give the OpenAI-compatible base URL"),
    ({"target": "url", "target_url": "ftp://example.com/v1"}, "target_url", "is not an http(s) URL"),
    ({"target": "url", "target_url": "http:///v1"}, "target_url", "is not an http(s) URL"),
])
def test_bad_input_is_refused_with_a_clear_error_and_starts_nothing(client, member, dispatched, changes, field,
                                                                    message, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/loadtests/start/?project={member.pk}", {**GOOD, **changes})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == [field] and message in " ".join(errors[field]), errors
    assert message.replace("'", "&#x27;") in response.content.decode() or message in response.content.decode()
    assert not LoadTestRun.objects.exists() and dispatched == []


@pytest.mark.django_db
def test_a_valid_form_starts_one_run_in_the_background(client, member, dispatched,
                                                       django_capture_on_commit_callbacks):
    form = {**GOOD, "target": "url", "target_url": "http://127.0.0.1:8100/v1/", "target_api_key": "sk-secret-of-target",
            "model": " gpt-x ", "test_type": "step", "qps": "40", "duration": "60"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/loadtests/start/?project={member.pk}", form)
    run = LoadTestRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/loadtests/{run.pk}/?project={member.pk}"
    assert run.project == member and run.status == "running" and run.test_type == "step"
    assert run.target_url == "http://127.0.0.1:8100/v1" and run.config["source"] == "page"
    assert run.config["model"] == "gpt-x" and run.config["qps"] == 40.0
    assert "sk-secret-of-target" not in json.dumps(run.config)  # the target's key is never stored
    ((run_pk, endpoint, target_key),) = dispatched
    assert run_pk == run.pk and endpoint == "http://testserver" and target_key == "sk-secret-of-target"
    page = client.get(response["Location"]).content.decode()
    assert 'data-status="running"' in page and "tracedash/loadtests.js" in page and "plotly" not in page


@pytest.mark.django_db
def test_one_running_test_per_project(client, member, dispatched, make_user, project_with_key,
                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/loadtests/start/?project={member.pk}", GOOD).status_code == 302
        busy = client.post(f"/loadtests/start/?project={member.pk}", GOOD)
    first = LoadTestRun.objects.get()
    assert busy.status_code == 409
    assert f"a load test is already running in this project (run {first.run_id}" in busy.content.decode()
    assert LoadTestRun.objects.count() == 1 and len(dispatched) == 1
    # Another project is not blocked.
    other, _ = project_with_key(members=[first.project.memberships.first().user])
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/loadtests/start/?project={other.pk}", GOOD).status_code == 302
    # A run whose server stopped under it (no heartbeat for minutes) is marked interrupted, not waited for.
    LoadTestRun.objects.filter(pk=first.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=3))
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/loadtests/start/?project={member.pk}", GOOD).status_code == 302
    first.refresh_from_db()
    assert first.status == "interrupted" and "server stopped" in first.error
    # `manage.py loadtest` runs (no heartbeat) never block the page.
    LoadTestRun.objects.filter(project=member).update(status="completed")
    LoadTestRun.objects.create(project=member, run_id="from-the-command", test_type="step", target_url="x", config={})
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/loadtests/start/?project={member.pk}", GOOD).status_code == 302


@pytest.mark.django_db
def test_the_load_tests_key_is_created_once_and_replaced_when_revoked(project_with_key):
    from projects.services import api_key_authenticate, api_key_revoke

    project, _ = project_with_key()
    first = load_test_key_ensure(project=project)
    assert load_test_key_ensure(project=project) == first
    keys = ApiKey.objects.filter(project=project, name=LOAD_TEST_KEY_NAME)
    assert keys.count() == 1 and api_key_authenticate(raw_key=first).project == project
    api_key_revoke(key=keys.get())
    second = load_test_key_ensure(project=project)
    assert second != first and api_key_authenticate(raw_key=first) is None
    assert api_key_authenticate(raw_key=second).name == LOAD_TEST_KEY_NAME
    assert keys.filter(revoked_at__isnull=True).count() == 1 and LoadTestKey.objects.count() == 1
    assert ApiKey.objects.get(project=project, name="default").revoked_at is None  # no other key revoked


def _every_stored_value():
    """(table, value) for every value of every row of every table of the metadata database."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for value in row:
                    yield table, value


@pytest.mark.django_db
def test_the_load_tests_key_is_stored_nowhere_only_its_hash_and_a_nonce(project_with_key):
    import re

    project, default_raw = project_with_key()
    raw = load_test_key_ensure(project=project)
    # formatted like every other key: td_<12 hex>_<32 URL-safe characters>
    assert re.fullmatch(r"td_[0-9a-f]{12}_[A-Za-z0-9_-]{32}", raw)
    assert len(raw) == len(default_raw)
    secret = raw.split("_", 2)[2]
    tables = set()
    for table, value in _every_stored_value():
        tables.add(table)
        text = value.decode(errors="replace") if isinstance(value, (bytes, memoryview)) else str(value)
        assert secret not in text, f"the load tests key's secret is stored in {table}"
    assert {"loadtests_loadtestkey", "projects_apikey"} <= tables  # both were read
    row = LoadTestKey.objects.select_related("api_key").get(project=project)
    assert len(row.nonce) == 32 and row.nonce not in raw
    assert raw.startswith(f"td_{row.api_key.prefix}_")
    assert row.api_key.key_hash == hashlib.sha256(raw.encode()).hexdigest()


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_the_derived_load_tests_key_authenticates_ingestion(client, project_with_key):
    from tests.spans import llm_trace

    project, _ = project_with_key()
    raw = load_test_key_ensure(project=project)
    spans = llm_trace()
    answer = client.post("/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert answer.status_code == 200 and answer.json() == {"accepted": len(spans), "rejected": []}
    assert ApiKey.objects.get(project=project, name=LOAD_TEST_KEY_NAME).last_used_at is not None


@pytest.mark.django_db
def test_a_changed_secret_key_leads_to_a_fresh_load_tests_key(project_with_key, caplog):
    from django.test import override_settings

    from projects.services import api_key_authenticate

    project, default_raw = project_with_key()
    first = load_test_key_ensure(project=project)
    first_nonce = LoadTestKey.objects.get(project=project).nonce
    with override_settings(SECRET_KEY="another-secret-key-" + "x" * 40):
        second = load_test_key_ensure(project=project)
        assert load_test_key_ensure(project=project) == second  # stable under the new SECRET_KEY
    assert second != first
    assert api_key_authenticate(raw_key=first) is None  # the old one (derivable from the old SECRET_KEY) is revoked
    assert api_key_authenticate(raw_key=second).name == LOAD_TEST_KEY_NAME
    assert api_key_authenticate(raw_key=default_raw).name == "default"  # nothing else revoked
    row = LoadTestKey.objects.get(project=project)
    assert row.nonce != first_nonce and row.api_key.prefix == second.split("_")[1]
    assert LoadTestKey.objects.count() == 1
    keys = ApiKey.objects.filter(project=project, name=LOAD_TEST_KEY_NAME)
    assert keys.count() == 2 and keys.filter(revoked_at__isnull=True).get().prefix == row.api_key.prefix
    assert "no longer matches" in caplog.text


def test_plan_options_split_the_duration():
    assert plan_options({"test_type": "concurrency", "qps": 10, "duration": 60}) == {
        "test_type": "concurrency", "qps": 10.0, "duration": 60.0}
    step = plan_options({"test_type": "step", "qps": 10, "duration": 60})
    assert step["step_duration"] == 6.0 and step["max_steps"] == 10
    burst = plan_options({"test_type": "burst", "qps": 10, "duration": 200})
    assert burst["ramp"] == 10.0  # DOMAIN.md: the rise takes at most 10 s
    parts = (burst["baseline_duration"], burst["ramp"], burst["hold"], burst["recover_duration"])
    assert parts == (40.0, 10.0, 40.0, 110.0) and sum(parts) == 200.0


@pytest.mark.django_db
def test_progress_json_is_the_runs_status(client, member):
    run = LoadTestRun.objects.create(project=member, run_id="r-progress", test_type="concurrency", target_url="x",
                                     config={"source": "page"}, progress={"sent": 3, "done": 2, "errors": 0})
    data = client.get(f"/loadtests/{run.pk}/progress.json").json()
    assert data == {"run_id": "r-progress", "status": "running", "progress": {"sent": 3, "done": 2, "errors": 0},
                    "error": "", "finished": False}
    page = client.get(f"/loadtests/{run.pk}/").content.decode()
    assert "sent 3 · done 2 · errors 0" in page
    assert f'href="/traces/?project={member.pk}&amp;attr=loadtest.run_id%3Dr-progress&amp;from=' in page
    # Its server stopped under it (no heartbeat for minutes): the page stops waiting for it.
    LoadTestRun.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    data = client.get(f"/loadtests/{run.pk}/progress.json").json()
    assert data["status"] == "interrupted" and data["finished"] and "server stopped" in data["error"]


@pytest.mark.django_db
def test_production_runs_are_a_celery_task(project_with_key, settings, monkeypatch,
                                           django_capture_on_commit_callbacks):
    from loadtests import tasks

    settings.CELERY_TASK_ALWAYS_EAGER = False
    sent = []
    monkeypatch.setattr(tasks.load_test_run_task, "delay", lambda *args: sent.append(args))
    project, _ = project_with_key()
    options = {"test_type": "burst", "qps": 5.0, "duration": 60.0, "target": "url", "target_url": "http://t/v1",
               "target_api_key": "sk-t", "model": ""}
    with django_capture_on_commit_callbacks(execute=True):
        run = load_test_start(project=project, options=options, trace_endpoint="http://web:8000")
    assert sent == [(run.pk, "http://web:8000", "sk-t")]
    assert tasks.load_test_run_task.name == "loadtests.run"


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_the_runner_traces_every_request_with_one_reused_key(asgi_server, project_with_key, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the embedded path (a thread), also when the run has a broker
    project, _ = project_with_key()
    runs = []
    with serve(SimulatorConfig.instant(decode_ms_per_token=1.0)) as sim:
        for _ in range(2):
            options = {"test_type": "concurrency", "qps": 5.0, "duration": 2.0, "target": "url",
                       "target_url": sim.base_url, "target_api_key": "", "model": ""}
            # embedded: the run goes on in a thread of this process (CELERY_TASK_ALWAYS_EAGER)
            run = load_test_start(project=project, options=options, trace_endpoint=asgi_server.url)
            wait_until(lambda: LoadTestRun.objects.get(pk=run.pk).status != "running", timeout=120,
                       interval=0.2, message="the run to end")
            runs.append(LoadTestRun.objects.get(pk=run.pk))
    for run in runs:
        assert run.status == "completed", run.error
        assert run.report["totals"]["planned"] == run.report["totals"]["ok"] == 10
        assert run.report["config"]["tracing"]["exporter"]["spans_sent"] == 20
        assert run.progress["sent"] == 10 and run.progress["planned_s"] == 2.0  # the last progress written
        rows = get_store().query(
            "SELECT count() FROM spans FINAL WHERE project_id = {p:UInt64} AND attributes['loadtest.run_id'] = "
            "{r:String} AND parent_span_id = ''", {"p": project.pk, "r": run.run_id}, tag="tests.loadtest_ui").rows
        assert rows == [(10,)]
    assert ApiKey.objects.filter(project=project, name=LOAD_TEST_KEY_NAME).count() == 1  # one key, both runs


@pytest.mark.django_db
def test_a_runner_failure_is_recorded_on_the_run(project_with_key, closed_port_url, monkeypatch):
    project, _ = project_with_key()
    run = LoadTestRun.objects.create(project=project, run_id="r-bad", test_type="concurrency", target_url="x",
                                     config={"source": "page", "test_type": "concurrency", "qps": 1.0,
                                             "duration": 1.0, "target": "url", "target_url": "x"})
    load_test_execute(run_pk=run.pk, trace_endpoint=None)  # "x" is no URL: the generator refuses it
    run.refresh_from_db()
    assert run.status == "failed" and "http(s) URL" in run.error and run.finished_at is not None


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_the_command_reuses_the_projects_load_tests_key(asgi_server, project_with_key, tmp_path, monkeypatch):
    from django.core.management import call_command

    monkeypatch.delenv("TRACEDASH_API_KEY", raising=False)
    project, _ = project_with_key(name="lt-command")
    with serve(SimulatorConfig.instant()) as sim:
        for i in range(2):
            call_command("loadtest", "--target", sim.base_url, "--qps", "10", "--duration", "0.5", "--project",
                         "lt-command", "--tracedash-endpoint", asgi_server.url, "--json", str(tmp_path / f"{i}.json"),
                         "--quiet")
    assert [r.status for r in LoadTestRun.objects.all()] == ["completed", "completed"]
    assert all(r.report["config"]["tracing"]["exporter"]["spans_sent"] == 10 for r in LoadTestRun.objects.all())
    # one key for both runs (before, each run of the command made a key of its own)
    assert list(ApiKey.objects.filter(project=project).exclude(name="default").values_list("name", flat=True)) == [
        LOAD_TEST_KEY_NAME]
