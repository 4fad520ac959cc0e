"""Per-project retention: the daily task deletes a project's rows older than its retention from
every data table (spans, summaries, samples, rollups); recent rows and other projects' rows stay,
and pages/JSON stop showing what went. The global TTL still drops whole old partitions."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from django.conf import settings
from django.urls import reverse

from config.celery import app
from analytics import attribute_index, rollup_services, rollups, summarizer
from analytics.retention_services import RETENTION_COLUMNS, RETENTION_EXEMPT, retention_enforce
from projects.models import Project
from store import get_store
from store.schema import SPANS, TABLES
from tests.alerts_support import insert_samples, sample
from tests.rollup_support import insert_spans, random_trace

NS = 1_000_000_000
DAY_NS = 86400 * NS


def _count(table: str, project_id: int, *, older_than_ns: int | None = None) -> int:
    column = RETENTION_COLUMNS[table]
    where = "project_id = {p:UInt64}"
    if older_than_ns is not None:
        where += f" AND {column} < toDateTime(intDiv({{t:Int64}}, {NS}), 'UTC')"
    return get_store().query(f"SELECT count() FROM {table} WHERE {where}", {"p": project_id, "t": older_than_ns or 0},
                             tag="tests.retention.count").rows[0][0]


def test_every_table_is_classified():
    """A new table must say whether per-project retention applies to it."""
    assert set(RETENTION_COLUMNS) | RETENTION_EXEMPT == set(TABLES)
    assert not set(RETENTION_COLUMNS) & RETENTION_EXEMPT
    for table, column in RETENTION_COLUMNS.items():
        assert TABLES[table].columns[0].name == "project_id" and column in TABLES[table].column_types()


def test_retention_is_in_the_beat_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["retention-enforce"]
    assert entry["schedule"] == 86400
    app.loader.import_default_modules()  # as the embedded beat and a worker do
    assert entry["task"] in app.tasks


@pytest.mark.django_db
def test_project_retention_defaults_to_global_and_is_bounded(project_with_key):
    from django.core.exceptions import ValidationError

    from projects.services import project_retention_update

    project, _ = project_with_key()
    assert project.retention_days == settings.TRACEDASH_RETENTION_DAYS
    for bad in (0, 3651):
        with pytest.raises(ValidationError):
            project_retention_update(project=project, retention_days=bad)
    project.refresh_from_db()
    assert project.retention_days == settings.TRACEDASH_RETENTION_DAYS


@pytest.mark.django_db
@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_settings_page_edits_retention_for_members_only(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    project, _ = project_with_key(members=[alice])
    other, _ = project_with_key(members=[bob])
    client.force_login(alice)
    url = reverse("dashboard:settings")
    page = client.get(url, {"project": project.pk})
    assert page.status_code == 200
    body = page.content.decode()
    assert 'name="retention_days"' in body and "csrfmiddlewaretoken" in body
    assert f'id="global-retention">{settings.TRACEDASH_RETENTION_DAYS}<' in body
    assert 'href="/settings/"' in body  # linked from the nav

    saved = client.post(f"{url}?project={project.pk}", {"retention_days": "7"})
    assert saved.status_code == 302
    project.refresh_from_db()
    assert project.retention_days == 7
    assert 'id="effective-retention">7<' in client.get(saved["Location"]).content.decode()

    for bad in ("0", "3651", "ten", ""):
        refused = client.post(f"{url}?project={project.pk}", {"retention_days": bad})
        assert refused.status_code == 400, bad
        assert 'class="errorlist' in refused.content.decode()
    project.refresh_from_db()
    assert project.retention_days == 7

    # Not a member of the other project: 404, nothing changed.
    assert client.post(f"{url}?project={other.pk}", {"retention_days": "2"}).status_code == 404
    other.refresh_from_db()
    assert other.retention_days == settings.TRACEDASH_RETENTION_DAYS


@pytest.mark.django_db
def test_settings_page_without_a_project_and_without_a_login(client, make_user):
    assert client.get("/settings/").status_code == 302  # to the login page
    client.force_login(make_user())
    page = client.get("/settings/")
    assert page.status_code == 200 and "not a member of any project" in page.content.decode()
    assert client.post("/settings/", {"retention_days": "3"}).status_code == 200


@pytest.mark.django_db
def test_settings_post_needs_csrf(make_user, project_with_key):
    from django.test import Client

    user = make_user()
    project, _ = project_with_key(members=[user])
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(user)
    assert csrf_client.post(f"/settings/?project={project.pk}", {"retention_days": "3"}).status_code == 403
    project.refresh_from_db()
    assert project.retention_days == settings.TRACEDASH_RETENTION_DAYS


@pytest.mark.django_db
def test_admin_shows_retention(admin_client, project_with_key):
    project, _ = project_with_key()
    page = admin_client.get(reverse("admin:projects_project_change", args=[project.pk]))
    assert page.status_code == 200 and 'name="retention_days"' in page.content.decode()


def _seed(project_id: int, *, days_ago: float, rng: random.Random, now_ns: int) -> str:
    start = now_ns - int(days_ago * DAY_NS)
    spans = random_trace(rng, start_ns=start)
    spans[0]["attributes"] = {"user.tier": "pro"}  # a declared key: the view indexes the root (span_key_values)
    insert_spans(project_id, spans)
    when = datetime.fromtimestamp(start / NS, tz=timezone.utc)
    insert_samples([sample(project_id, when, mem_pct=50, util=40, temp=60),
                    sample(project_id, when, gpu_index=-1, cpu=20, host_mem_pct=30)])
    get_store().insert("span_logs", [{  # a GenAI event of the trace's root (POST /v1/logs)
        "project_id": project_id, "trace_id": spans[0]["trace_id"], "span_id": spans[0]["span_id"], "time": start,
        "event_name": "gen_ai.user.message", "severity": "", "body": '{"content":"hi"}', "attributes": {},
        "service": "svc", "resource_attributes": {}}], tag="tests.retention.span_logs")
    get_store().insert("engine_samples", [{  # an inference engine's KV-cache usage (POST /api/v1/engine_samples)
        "project_id": project_id, "time": start, "host": "gpu-1", "engine": "vllm", "target": "http://gpu-1:8000/metrics",
        "model": "llama", "metric": "kv_cache_usage", "le": 0.0, "value": 50.0}], tag="tests.retention.engine_samples")
    get_store().insert("scores", [{  # a reviewer's rating of the trace, given when it ran (POST /api/v1/scores)
        "project_id": project_id, "trace_id": spans[0]["trace_id"], "span_id": "", "name": "quality",
        "score_id": f"s-{start}", "data_type": "numeric", "value": 4.0, "string_value": "", "source": "annotation",
        "author": "reviewer", "comment": "", "time": start}], tag="tests.retention.scores")
    return spans[0]["trace_id"]


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_old_rows_go_for_the_short_retention_project_only(client, make_user, project_with_key):
    assert settings.TRACEDASH_RETENTION_DAYS >= 30
    user = make_user()
    a, _ = project_with_key(members=[user])
    b, _ = project_with_key(members=[user])
    Project.objects.filter(pk=a.pk).update(retention_days=7)
    Project.objects.filter(pk=b.pk).update(retention_days=30)
    rng = random.Random(9)
    now_ns = time.time_ns()
    for p in (a, b):
        attribute_index.key_declare(project_id=p.pk, key="user.tier")
    ids = {(p.pk, age): _seed(p.pk, days_ago=age, rng=rng, now_ns=now_ns) for p in (a, b) for age in (10, 1)}
    summarizer.traces_summarize(project_ids=[a.pk, b.pk])
    rollup_services.rollups_update(project_ids=[a.pk, b.pk])

    cutoff_a = now_ns - 7 * DAY_NS
    for table in RETENTION_COLUMNS:  # every table holds old and recent rows of both projects first
        for p in (a, b):
            assert _count(table, p.pk) > _count(table, p.pk, older_than_ns=cutoff_a) > 0, (table, p.name)

    def visible(project, trace_id):
        return client.get(f"/api/v1/traces/{trace_id}", {"project": project.pk}).status_code

    def listed(project):
        rows = client.get("/traces/rows.json", {"project": project.pk, "range": "30d"}).json()["rows"]
        return {r["trace_id"] for r in rows}

    def requests_30d(project):
        end = datetime.now(timezone.utc)
        return rollups.window_stats(project_id=project.pk, start=end - timedelta(days=30), end=end).requests

    def resource_points(project):
        body = client.get("/resources/series.json", {"project": project.pk, "range": "30d"}).json()
        return sum(1 for d in body["devices"] for values in d["values"].values() for v in values if v is not None)

    client.force_login(user)
    points_before = {p.pk: resource_points(p) for p in (a, b)}
    assert points_before[a.pk] > 0
    assert visible(a, ids[a.pk, 10]) == 200 and listed(a) == {ids[a.pk, 10], ids[a.pk, 1]}
    assert requests_30d(a) == requests_30d(b) == 2

    report = retention_enforce(now_ns=now_ns)
    assert report.projects >= 1 and a.pk in report.cutoffs and b.pk not in report.cutoffs

    for table in RETENTION_COLUMNS:
        assert _count(table, a.pk, older_than_ns=cutoff_a) == 0, table  # A: 10 days ago is gone
        assert _count(table, a.pk) > 0, table  # A: yesterday stays
        assert _count(table, b.pk, older_than_ns=cutoff_a) > 0, table  # B (30 days): 10 days ago stays
    # Pages and JSON no longer show A's old trace; B's are all there.
    assert visible(a, ids[a.pk, 10]) == 404 and visible(a, ids[a.pk, 1]) == 200
    assert listed(a) == {ids[a.pk, 1]}
    assert listed(b) == {ids[b.pk, 10], ids[b.pk, 1]}
    assert visible(b, ids[b.pk, 10]) == 200
    assert requests_30d(a) == 1 and requests_30d(b) == 2
    assert 0 < resource_points(a) < points_before[a.pk]  # the 10-day-old samples are off the chart
    assert resource_points(b) == points_before[b.pk]

    # Running it again, as the beat does (the Celery task), changes nothing more.
    app.loader.import_default_modules()
    result = app.tasks[settings.CELERY_BEAT_SCHEDULE["retention-enforce"]["task"]].apply(throw=True).get()
    assert result["projects"] >= 1 and result["statements"] == result["projects"] * len(RETENTION_COLUMNS)
    assert listed(a) == {ids[a.pk, 1]} and listed(b) == {ids[b.pk, 10], ids[b.pk, 1]}


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_the_global_ttl_is_on_every_retention_table():
    store = get_store()
    for table in ("spans", "resource_samples", "traces_by_start", "rollup_minute", "resource_minute"):
        ddl = store.query(f"SHOW CREATE TABLE {table}", tag="tests.retention.ddl").rows[0][0]
        assert f"toIntervalDay({settings.TRACEDASH_RETENTION_DAYS})" in ddl, table
        assert "ttl_only_drop_parts = 1" in ddl, table


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_global_ttl_drops_whole_old_partitions_and_keeps_recent_ones():
    """The spans table's own DDL (same TTL and ttl_only_drop_parts) on a probe table: rows of
    several days, then a TTL shorter than the oldest ones; after OPTIMIZE … FINAL the expired
    days' partitions are gone whole and the recent ones are all there."""
    store = get_store()
    probe = dataclasses.replace(SPANS, name=f"retention_probe_{uuid.uuid4().hex[:8]}")
    store.command(probe.create_sql(retention_days=365), tag="tests.retention.probe")
    try:
        now_ns = time.time_ns()
        rng = random.Random(3)
        for days in (1, 2, 5, 6, 8):
            insert_spans(1, random_trace(rng, start_ns=now_ns - days * DAY_NS))
        store.command(f"INSERT INTO {probe.name} SELECT * FROM spans WHERE project_id = 1", tag="tests.retention.probe")

        def days_present():
            return sorted(r[0] for r in store.query(
                f"SELECT DISTINCT dateDiff('day', toDate(start_time), today()) FROM {probe.name}",
                tag="tests.retention.probe").rows)

        assert days_present() == [1, 2, 5, 6, 8]
        store.command(f"ALTER TABLE {probe.name} MODIFY TTL toDateTime(start_time) + toIntervalDay(4)",
                      tag="tests.retention.probe")
        store.command(f"OPTIMIZE TABLE {probe.name} FINAL", tag="tests.retention.probe")
        assert days_present() == [1, 2]
        partitions = {r[0] for r in store.query(
            "SELECT DISTINCT partition FROM system.parts WHERE database = currentDatabase() AND table = {t:String} "
            "AND active AND rows > 0", {"t": probe.name}, tag="tests.retention.probe").rows}
        assert len(partitions) == 2
    finally:
        store.command(f"DROP TABLE IF EXISTS {probe.name}", tag="tests.retention.probe")
