"""The inference engines' alert rules over real engine samples at scripted times: the default
"KV cache > 90 % for 1 min" firing only once the cache has stayed full a minute and resolving when
it drains, one series per engine instance, waiting requests, engine TTFT P95 from the histogram,
the rule preview, and the default rules installed (and migrated into older projects)."""

from __future__ import annotations

import importlib
import math
from datetime import timedelta

import pytest

from alerts.models import AlertEvent, AlertRule, AlertSeries
from alerts.preview import rule_preview_figure
from alerts.services import ENGINE_DEFAULT_RULES, alerts_evaluate_round, rule_create
from store import get_store
from tests.alerts_support import T0, ns
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

GPU1 = "http://gpu-1:8000/metrics"
GPU2 = "http://gpu-2:8000/metrics"
KEY1 = f"engine=vllm,target={GPU1},model=llama"
KEY2 = f"engine=vllm,target={GPU2},model=llama"


def engine_row(project_id, when, metric, value, *, target=GPU1, le=0.0):
    return {"project_id": project_id, "time": ns(when), "host": target.split("//")[1].split(":")[0], "engine": "vllm",
            "target": target, "model": "llama", "metric": metric, "le": le, "value": float(value)}


def insert(rows):
    get_store().insert("engine_samples", rows, tag="tests.alerts.engines")


def kv(project_id, seconds, value, target=GPU1):
    return engine_row(project_id, T0 + timedelta(seconds=seconds), "kv_cache_usage", value, target=target)


def evaluate(at_seconds):
    return alerts_evaluate_round(now=T0 + timedelta(seconds=at_seconds), deliver="inline")


def states(rule):
    return {s.key: s.state for s in AlertSeries.objects.filter(rule=rule)}


@pytest.fixture
def project(project_with_key):
    project, _ = project_with_key()
    return project


def _default(project, metric):
    rule = AlertRule.objects.get(project=project, metric=metric)
    AlertRule.objects.filter(project=project).exclude(pk=rule.pk).delete()
    return rule


def test_the_default_kv_cache_rule_fires_after_a_full_minute_and_resolves(project):
    rule = _default(project, "engine_kv_cache_percent")
    assert (rule.comparator, rule.threshold, rule.for_seconds, rule.window_seconds) == ("gt", 90, 60, 60)
    with WebhookReceiver() as hook:
        from alerts.services import channel_create

        rule.channels.add(channel_create(project=project, name="hook", kind="webhook", url=hook.url + "/a",
                                         group_interval_seconds=0))
        # a scrape every 10 s: 50 % then full from 20 s on; a second engine stays at 40 %
        insert([kv(project.pk, 0, 50), kv(project.pk, 10, 60)] + [kv(project.pk, s, 97) for s in range(20, 100, 10)]
               + [kv(project.pk, s, 40, GPU2) for s in range(0, 100, 10)])
        evaluate(25)
        assert states(rule) == {KEY1: "pending", KEY2: "inactive"}
        evaluate(55)
        assert states(rule)[KEY1] == "pending"  # full for 35 s only
        evaluate(85)
        assert states(rule) == {KEY1: "firing", KEY2: "inactive"}  # full since 20 s: over a minute
        assert len(hook.requests) == 1
        alert = hook.requests[0].json["alerts"][0]
        assert alert["labels"]["engine"] == "vllm" and alert["labels"]["target"] == GPU1
        assert alert["value"] == pytest.approx(97)
        # the cache drains; keep_firing_for 60 s holds the alert a minute more, then it resolves
        insert([kv(project.pk, s, 30) for s in range(100, 220, 10)])
        evaluate(105)
        assert states(rule)[KEY1] == "firing"
        evaluate(175)
        assert states(rule)[KEY1] == "resolved"
        assert [r.json["status"] for r in hook.requests] == ["firing", "resolved"]
    history = list(AlertEvent.objects.filter(rule=rule, series_key=KEY1).order_by("at").values_list("from_state", "to_state"))
    assert history[-2:] == [("pending", "firing"), ("firing", "resolved")]


def test_waiting_requests_rule_and_the_model_scope(project):
    rule = _default(project, "engine_requests_waiting")
    assert (rule.threshold, rule.for_seconds) == (10, 60)
    insert([engine_row(project.pk, T0 + timedelta(seconds=s), "requests_waiting", 25) for s in range(0, 90, 10)])
    for at in range(5, 80, 10):  # a round every 10 s sees the breach held continuously
        evaluate(at)
    assert states(rule) == {KEY1: "firing"}
    scoped = rule_create(project=project, name="other model only", metric="engine_requests_waiting",
                         aggregation="last", window_seconds=60, comparator="gt", threshold=10, model="mistral")
    evaluate(80)
    assert states(scoped) == {}


def test_engine_ttft_p95_comes_from_the_histogram_in_the_window(project):
    rule = _default(project, "engine_ttft_p95_ms")
    assert (rule.metric, rule.aggregation, rule.threshold, rule.window_seconds) == ("engine_ttft_p95_ms", "window", 1000, 300)
    AlertRule.objects.filter(pk=rule.pk).update(for_seconds=0)

    def hist(seconds, cumulative):
        return [engine_row(project.pk, T0 + timedelta(seconds=seconds), "ttft_seconds", c, le=le)
                for le, c in zip((0.5, 1.0, 2.5, math.inf), cumulative)]

    # 20 requests in the window: 2 under 0.5 s, 18 in (1, 2.5] -> P95 at rank 19: 1 + 1.5 * 17/18 s
    insert(hist(-30, [0, 0, 0, 0]) + hist(60, [2, 2, 20, 20]))
    evaluate(90)
    series = AlertSeries.objects.get(rule=rule)
    assert series.state == "firing" and series.value == pytest.approx(1000 + 1500 * 17 / 18, rel=1e-6)
    # five minutes later no request finished: the figure is missing, never 0
    evaluate(90 + 400)
    assert AlertSeries.objects.get(rule=rule).no_data


def test_the_preview_draws_the_engine_metric_per_instance(project):
    rule = _default(project, "engine_kv_cache_percent")
    now = T0 + timedelta(minutes=10)
    insert([kv(project.pk, s, 95) for s in range(0, 300, 30)] + [kv(project.pk, s, 20, GPU2) for s in range(0, 300, 30)])
    figure = rule_preview_figure(rule=rule, now=now)
    names = {trace.get("name") for trace in figure["data"]}
    assert KEY1 in names and KEY2 in names
    line = next(t for t in figure["data"] if t.get("name") == KEY1)
    assert max(line["y"]) == pytest.approx(95)


def test_engine_default_rules_are_installed_and_migrated_into_older_projects(project):
    from django.apps import apps

    names = {spec["name"] for spec in ENGINE_DEFAULT_RULES}
    assert names <= set(AlertRule.objects.filter(project=project).values_list("name", flat=True))
    assert all(spec["for_seconds"] >= 60 for spec in ENGINE_DEFAULT_RULES)
    AlertRule.objects.filter(project=project, name__in=names).delete()  # a project made before them
    AlertRule.objects.filter(project=project, metric="engine_requests_waiting").delete()
    rule_create(project=project, name="Engine KV cache > 90 % for 1 min", metric="engine_kv_cache_percent",
                aggregation="last", window_seconds=60, comparator="gt", threshold=80)  # its own, same name: kept
    migration = importlib.import_module("alerts.migrations.0004_engine_metrics")
    migration.forwards(apps, None)
    installed = {r.name: r for r in AlertRule.objects.filter(project=project, name__in=names)}
    assert set(installed) == names
    assert installed["Engine KV cache > 90 % for 1 min"].threshold == 80
    assert installed["Engine TTFT P95 > 1000 ms"].is_default


def _history(rule, key):
    return list(AlertEvent.objects.filter(rule=rule, series_key=key).order_by("at").values_list("from_state", "to_state"))


def test_the_default_waiting_rule_fires_after_a_full_minute_and_resolves(project):
    rule = _default(project, "engine_requests_waiting")
    assert (rule.comparator, rule.threshold, rule.for_seconds, rule.keep_firing_for_seconds) == ("gt", 10, 60, 60)
    # 4 waiting, then 25 from 20 s on (a scrape every 10 s); exactly the threshold is not over it
    insert([engine_row(project.pk, T0 + timedelta(seconds=s), "requests_waiting", 4) for s in (0, 10)]
           + [engine_row(project.pk, T0 + timedelta(seconds=s), "requests_waiting", 25) for s in range(20, 100, 10)])
    evaluate(15)
    assert states(rule) == {KEY1: "inactive"}
    evaluate(25)
    assert states(rule) == {KEY1: "pending"}
    evaluate(55)
    assert states(rule) == {KEY1: "pending"}  # 35 s over the threshold only
    evaluate(85)
    assert states(rule) == {KEY1: "firing"}
    assert AlertSeries.objects.get(rule=rule).value == 25
    # the queue drains to the threshold itself: held firing a minute more, then resolved
    insert([engine_row(project.pk, T0 + timedelta(seconds=s), "requests_waiting", 10) for s in range(100, 220, 10)])
    evaluate(105)
    assert states(rule) == {KEY1: "firing"}
    evaluate(175)
    assert states(rule) == {KEY1: "resolved"}
    assert _history(rule, KEY1) == [("inactive", "pending"), ("pending", "firing"), ("firing", "resolved")]


def test_the_default_engine_ttft_rule_fires_after_five_minutes_and_resolves(project):
    """The default as installed (5-minute window, held 5 minutes, kept firing 1 minute): slow first
    tokens until 480 s, fast ones after; the P95 over the window falls under 1 s only once the
    window holds no slow request, and the alert resolves a minute after that."""
    rule = _default(project, "engine_ttft_p95_ms")
    assert (rule.threshold, rule.window_seconds, rule.for_seconds, rule.keep_firing_for_seconds) == (1000, 300, 300, 60)
    rows, cumulative = [], [0, 0, 0, 0]  # buckets le 0.5, 1, 2.5, +Inf
    for seconds in range(-30, 1000, 30):
        if seconds > -30:  # 10 requests a scrape: in (1, 2.5] s until 480 s, under 0.5 s after
            cumulative = [c + 10 for c in cumulative] if seconds > 480 else \
                [cumulative[0], cumulative[1], cumulative[2] + 10, cumulative[3] + 10]
        rows += [engine_row(project.pk, T0 + timedelta(seconds=seconds), "ttft_seconds", c, le=le)
                 for le, c in zip((0.5, 1.0, 2.5, math.inf), cumulative)]
    insert(rows)
    seen = {}
    for at in range(15, 960, 30):  # a round every 30 s
        evaluate(at)
        seen[at] = AlertSeries.objects.get(rule=rule).state
    assert seen[15] == "pending" and seen[285] == "pending"  # held 270 s
    assert seen[315] == "firing"  # held 300 s
    assert AlertSeries.objects.get(rule=rule).value is not None
    assert all(seen[at] == "firing" for at in range(315, 796, 30))  # slow requests in the window until 780 s, then 60 s kept
    assert seen[855] == "resolved" and seen[945] == "resolved"
    assert _history(rule, "engine=vllm,target=http://gpu-1:8000/metrics,model=llama") == [
        ("inactive", "pending"), ("pending", "firing"), ("firing", "resolved")]


def test_a_round_reads_a_sampled_source_only_when_its_window_holds_a_sample(project, monkeypatch):
    """One probe per round finds each project's newest engine / resource / process sample; a source
    without a sample in a rule's window is not read (its read would find no series), one with a
    sample at the window's last millisecond is."""
    import alerts.metrics as metrics

    rule = _default(project, "engine_kv_cache_percent")  # over 90 % for 60 s
    reads = []
    real = metrics.engines_fetch
    monkeypatch.setattr(metrics, "engines_fetch", lambda **kw: reads.append(kw["window_seconds"]) or real(**kw))

    report = evaluate(100)
    assert reads == [] and report.errors == {} and states(rule) == {}  # no engine sample at all: not read
    insert([kv(project.pk, 40, 95.0)])
    report = evaluate(100)  # the sample lies exactly at the window's start, (40, 100]: outside
    assert reads == [] and report.errors == {}
    report = evaluate(99.999)  # (39.999, 99.999]: now the sample is in the window's first millisecond
    assert reads == [60] and report.errors == {}
    assert set(states(rule)) == {KEY1}
    # The probe failing leaves every source read, as without it.
    monkeypatch.setattr(metrics, "newest_samples", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("down")))
    evaluate(200)
    assert reads == [60, 60]
