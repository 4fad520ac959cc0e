"""Writes for alerts: the evaluation round, notifications and their delivery, rules, channels,
silences, acknowledgements, and the default rules of a new project.

The round (``alerts_evaluate_round``), what the Celery beat entry ``alerts-evaluate`` runs:

1. claim the projects' evaluation leases a few at a time (``server.leases``: ``SELECT … FOR
   UPDATE SKIP LOCKED`` on PostgreSQL, one conditional UPDATE on SQLite): rounds running at the
   same time (several workers, or two beats) share the projects and never evaluate one twice; a
   crashed holder's leases expire after ``LEASE_SECONDS``. Each claimed batch is steps 2-3;
2. run each distinct (project, source, window[, model]) query once, shared by all its rules;
3. step every series through the state machine (alerts.state_machine) and write the transitions,
   the history (AlertEvent) and the notifications of groups that are due, in one transaction.
   A series is rewritten only if it is still as this round read it (state and ``updated_at``):
   should another evaluator have written it meanwhile (a lease that expired under a round that
   ran too long), the batch's transaction is rolled back, so no transition, history entry or
   notification is ever written twice; the next round evaluates those projects again;
4. after commit: hand new and due notifications to delivery (a Celery task with a broker; a small
   thread pool in the embedded mode, so a slow receiver never holds up the next round) and push
   the change to open pages (Channels).

A query that fails marks its rules with the error (shown on the alerts page and logged); their
series keep their state (no data is not invented) and the other rules are evaluated as usual.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from config.db_retry import retry_locked

from . import metrics, notifiers
from .models import (AlertEvent, AlertRule, AlertSeries, DeliveryAttempt, Notification,
                     NotificationChannel, NotificationGroup, Silence)
from .silences import matchers_validate, silenced
from .state_machine import FIRING, PENDING, RESOLVED, RuleSpec, State, step

log = logging.getLogger("tracedash.alerts")

LEASE_NAME = "alerts-evaluate"
LEASE_SECONDS = 60
CLAIM_SECONDS = 60  # a notification claimed by a worker that died is retried after this
BACKOFF_SECONDS = (5, 15, 45, 120, 300, 600)  # delay after attempt 1, 2, …; then the last one
MAX_ATTEMPTS = 8
TOUCH_SECONDS = 30  # an unchanged quiet series' value and last-seen time are written at most this often
PRUNE_SECONDS = 24 * 3600  # resolved/inactive series without data this long are deleted
_HOLDER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class RoundReport:
    skipped: bool = False  # every project was being evaluated by another round
    projects: int = 0  # projects this round evaluated
    conflicts: int = 0  # batches given up because another evaluator wrote their series first
    rules: int = 0
    series: int = 0
    queries: int = 0
    transitions: int = 0
    notifications: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)  # rule id -> error
    seconds: float = 0.0


# --- the round -----------------------------------------------------------------------------------

GAP_MIN_SECONDS = 30
GAP_MAX_SECONDS = 120


def gap_tolerance(window_seconds: float) -> float:
    """The longest gap between two breaching samples that still counts as one continuous breach
    for a rule's ``for``: the rule's window (a sample in the window still backs the value), at
    least 30 s (a few missed samples of an agent sampling every few seconds), at most 2 minutes."""
    return float(min(max(window_seconds, GAP_MIN_SECONDS), GAP_MAX_SECONDS))


def _spec(rule: AlertRule) -> RuleSpec:
    return RuleSpec(comparator=rule.comparator, threshold=rule.threshold, for_seconds=rule.for_seconds,
                    keep_firing_for_seconds=rule.keep_firing_for_seconds, missing_data=rule.missing_data,
                    grace_seconds=rule.missing_grace_seconds, gap_seconds=gap_tolerance(rule.window_seconds))


def _state_of(series: AlertSeries) -> State:
    return State(state=series.state, value=series.value, no_data=series.no_data, active_since=series.active_since,
                 fired_at=series.fired_at, resolved_at=series.resolved_at, last_breach_at=series.last_breach_at,
                 last_seen_at=series.last_seen_at, missing_since=series.missing_since,
                 last_sample_at=series.last_sample_at)


_STATE_FIELDS = ("state", "value", "no_data", "active_since", "fired_at", "resolved_at", "last_breach_at",
                 "last_seen_at", "missing_since", "last_sample_at")


RULE_SERIES_KEY = ""  # a rule's own series: "no data at all" under the `alert` missing-data policy


def _scope_labels(rule: AlertRule) -> dict:
    scope = {"host": rule.host, "gpu": "" if rule.gpu_index is None else str(rule.gpu_index),
             "service": rule.service, "model": rule.model}
    if rule.group_by:
        scope[rule.group_by] = rule.group_value
    return {k: v for k, v in scope.items() if v}


def _fetch_key(rule: AlertRule) -> tuple:
    """Rules with one key share one query: (project, source, window, model, group_by, group_value,
    service); the last three only for a grouped latency rule (its query filters on them)."""
    source = metrics.source_of(rule.metric)
    if source != "spans":
        return (rule.project_id, source, rule.window_seconds, "", "", "", "")
    if not rule.group_by:
        return (rule.project_id, source, rule.window_seconds, rule.model, "", "", "")
    return (rule.project_id, source, rule.window_seconds, rule.model, rule.group_by, rule.group_value, rule.service)


def alerts_evaluate_round(*, now: datetime | None = None, deliver: str = "queue", holder: str | None = None,
                          project_ids: list[int] | None = None) -> RoundReport:
    """Evaluate every enabled rule once at ``now`` (default: the clock), project by project under
    the projects' evaluation leases (a project another round holds is left to it).

    ``deliver``: ``queue`` hands notifications to background delivery, ``inline`` delivers them
    before returning (tests, benchmarks), ``none`` leaves them for the next round's sweep."""
    from server.leases import run_by_project

    started = time.perf_counter()
    now = now or timezone.now()
    holder = holder or f"{_HOLDER}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"
    report = RoundReport()
    if project_ids is None:
        from projects.models import Project

        # A read can meet SQLite's table lock too where the database is shared-cache (the tests'
        # in-memory one) while another round claims its leases.
        project_ids = retry_locked(lambda: list(Project.objects.order_by("pk").values_list("pk", flat=True)))
    try:
        done = run_by_project(LEASE_NAME, lambda batch: _evaluate_batch(now, report, batch), project_ids,
                              holder=holder, seconds=LEASE_SECONDS)
    except Exception:
        log.exception("alert evaluation round failed")
        raise
    finally:
        report.seconds = time.perf_counter() - started
    report.projects = len(done)
    report.skipped = bool(project_ids) and not done
    if deliver == "inline":
        notifications_deliver_due(now=now)
    elif deliver == "queue":
        notifications_enqueue_due(now=now)
    return report


class _Conflict(Exception):
    """Another evaluator wrote one of this batch's series after this one read it."""


def _evaluate_batch(now: datetime, report: RoundReport, project_ids: list[int]) -> None:
    """Evaluate these projects; when another evaluator changed one of their series meanwhile (its
    lease had expired under a round that ran too long), nothing of this batch is written: the
    transaction is rolled back, so no transition and no notification is written twice."""
    batch = RoundReport()
    try:
        _evaluate(now, batch, project_ids)
    except (_Conflict, IntegrityError) as exc:
        report.conflicts += 1
        report.errors.update(batch.errors)
        log.warning("alert evaluation of project(s) %s skipped: another evaluator wrote their series meanwhile (%s)",
                    project_ids, exc)
        return
    report.rules += batch.rules
    report.series += batch.series
    report.queries += batch.queries
    report.transitions += batch.transitions
    report.notifications += batch.notifications
    report.errors.update(batch.errors)


def _evaluate(now: datetime, report: RoundReport, project_ids: list[int] | None) -> None:
    rules_qs = AlertRule.objects.filter(enabled=True).select_related("project")
    if project_ids is not None:
        rules_qs = rules_qs.filter(project_id__in=project_ids)
    rules = list(rules_qs)
    report.rules = len(rules)
    _disabled_rules_settle(now, project_ids, report)
    if not rules:
        return
    by_fetch: dict[tuple, list[AlertRule]] = defaultdict(list)
    for rule in rules:
        by_fetch[_fetch_key(rule)].append(rule)
    fetched: dict[tuple, list] = {}
    sampled: dict[tuple[int, str], int] = {}
    for project_id, source, window, *_ in by_fetch:
        if source in metrics.SAMPLED_SOURCES:
            sampled[(project_id, source)] = max(window, sampled.get((project_id, source), 0))
    try:
        newest = metrics.newest_samples(sampled, now=now)
        report.queries += bool(sampled)
    except Exception as exc:  # noqa: BLE001 - then every source is read, as without the probe
        log.warning("alert round: the newest samples could not be read (%s); reading every source", exc)
        newest = None
    now_ms = int(now.timestamp() * 1000)
    for key in by_fetch:
        project_id, source, window, model, group_by, group_value, service = key
        if newest is not None and source in metrics.SAMPLED_SOURCES \
                and newest.get((project_id, source), -1) <= now_ms - window * 1000:
            fetched[key] = []  # no sample in the window: no series (what the read would return)
            continue
        try:
            fetched[key] = metrics.fetch(project_id=project_id, source=source, window_seconds=window, now=now, model=model,
                                         group_by=group_by, group_value=group_value, service=service)
        except Exception as exc:  # noqa: BLE001 - recorded on each rule, logged, the other rules go on
            message = f"{type(exc).__name__}: {exc}"[:2000]
            log.error("alert query %s failed: %s", key, message)
            for rule in by_fetch[key]:
                report.errors[rule.pk] = message
        report.queries += 1

    # Plain rows, not model instances: building thousands of instances each round costs more
    # than the whole evaluation.
    existing: dict[int, dict[str, _SeriesRow]] = defaultdict(dict)
    for values in AlertSeries.objects.filter(rule__in=[r.pk for r in rules if r.pk not in report.errors]) \
            .values_list(*_LOAD_FIELDS):
        row = _SeriesRow(**dict(zip(_LOAD_FIELDS, values)))
        existing[row.rule_id][row.key] = row
    by_host: dict[tuple, dict[str, list]] = {}
    for key, series_list in fetched.items():
        index: dict[str, list] = defaultdict(list)
        for one in series_list:
            index[one.labels.get("host", "")].append(one)
        by_host[key] = index

    creates, updates, heartbeats, deletes, events = [], [], [], [], []
    changed_projects: set[int] = set()
    touch_after = timedelta(seconds=TOUCH_SECONDS)
    for rule in rules:
        if rule.pk in report.errors:
            continue
        spec = _spec(rule)
        fetch_key = _fetch_key(rule)
        candidates = by_host[fetch_key].get(rule.host, []) if rule.host else fetched[fetch_key]
        values = metrics.rule_values(rule, candidates)
        sampled = {s.key: s.sample_at for s in candidates}
        mine = existing[rule.pk]
        watching = spec
        if rule.missing_data == "alert":
            # Nothing matches the scope at all (no host, GPU or service ever reported, or all
            # are gone): the rule's own series (key "") carries the no-data alert; it resolves
            # once real series exist again.
            if not values:
                values = {RULE_SERIES_KEY: (_scope_labels(rule), None)}
            elif RULE_SERIES_KEY in mine:
                watching = RuleSpec(**{**spec.__dict__, "missing_data": "resolve"})
        for key in values.keys() | mine.keys():
            labels, value = values.get(key, (None, None))
            series = mine.get(key)
            before = _state_of(series) if series is not None else State()
            after, transition = step(watching if key == RULE_SERIES_KEY else spec, before, value, now,
                                     sampled.get(key) if value is not None else None)
            if series is None:
                if value is None and key != RULE_SERIES_KEY:
                    continue
                series = AlertSeries(rule=rule, project_id=rule.project_id, key=key, labels=labels)
                mine[key] = series
                new = True
            else:
                new = False
            report.series += 1
            dirty = new or transition is not None or after.state in (PENDING, FIRING) or after.no_data != before.no_data \
                or before.last_seen_at is None or (after.last_seen_at and after.last_seen_at - before.last_seen_at >= touch_after) \
                or (after.no_data and before.missing_since is None)
            if after.stale and after.state != FIRING and not new and transition is None and \
                    series.last_seen_at and now - series.last_seen_at >= timedelta(seconds=PRUNE_SECONDS):
                deletes.append(series.id)
                del mine[key]
                continue
            if not dirty:
                continue
            if not new:
                series.guard = (series.state, series.updated_at)  # what this round read (_series_update_many)
            for name in _STATE_FIELDS:
                setattr(series, name, getattr(after, name))
            if labels is not None:
                series.labels = labels
            series.updated_at = now
            if transition is not None:
                changed_projects.add(rule.project_id)
                report.transitions += 1
                if transition.to_state in (RESOLVED, "inactive"):
                    series.acknowledged_at = None
                    series.acknowledged_by_id = None
                events.append(AlertEvent(project_id=rule.project_id, rule=rule, series_key=key, labels=series.labels,
                                         from_state=transition.from_state, to_state=transition.to_state,
                                         value=after.value if not after.no_data else None,
                                         reason=transition.reason[:200], at=now))
            if new:
                creates.append(series)
            elif transition is None and after.no_data == before.no_data and labels == series.labels:
                heartbeats.append(series)  # only value and times moved
            else:
                updates.append(series)

    with transaction.atomic():
        if creates:
            AlertSeries.objects.bulk_create(creates, batch_size=500)
        if updates:
            _series_update_many(updates, _UPDATE_FIELDS, guarded=True)
        if heartbeats:
            _series_update_many(heartbeats, _HEARTBEAT_FIELDS, guarded=True)
        if deletes:
            AlertSeries.objects.filter(pk__in=deletes).delete()
        if events:
            AlertEvent.objects.bulk_create(events, batch_size=500)
        _rules_health_save(rules, report.errors, now)
        report.notifications = _notifications_plan(rules, report.errors, now, existing)
        if changed_projects:
            transaction.on_commit(lambda: _push_live(sorted(changed_projects)))


def _disabled_rules_settle(now: datetime, project_ids: list[int] | None, report: RoundReport) -> None:
    """A disabled rule's firing series resolve (and pending ones go inactive) at once, with a
    history entry, so nothing keeps showing as firing for a rule nobody evaluates."""
    active = AlertSeries.objects.filter(rule__enabled=False, state__in=[PENDING, FIRING])
    if project_ids is not None:
        active = active.filter(project_id__in=project_ids)
    rows = list(active)
    if not rows:
        return
    events = []
    for series in rows:
        series.guard = (series.state, series.updated_at)
        to_state = RESOLVED if series.state == FIRING else "inactive"
        events.append(AlertEvent(project_id=series.project_id, rule_id=series.rule_id, series_key=series.key,
                                 labels=series.labels, from_state=series.state, to_state=to_state, value=None,
                                 reason="rule disabled", at=now))
        series.state = to_state
        series.resolved_at = now if to_state == RESOLVED else series.resolved_at
        series.active_since = None
        series.acknowledged_at = None
        series.acknowledged_by_id = None
        series.updated_at = now
    with transaction.atomic():
        _series_update_many(rows, _UPDATE_FIELDS, guarded=True)
        AlertEvent.objects.bulk_create(events)
        projects = sorted({s.project_id for s in rows})
        transaction.on_commit(lambda: _push_live(projects))
    report.transitions += len(events)


_UPDATE_FIELDS = (*_STATE_FIELDS, "labels", "updated_at", "acknowledged_at", "acknowledged_by")
_HEARTBEAT_FIELDS = ("value", "last_breach_at", "last_seen_at", "active_since", "last_sample_at", "updated_at")
_LOAD_FIELDS = ("id", "rule_id", "key", "labels", *_STATE_FIELDS, "acknowledged_at", "acknowledged_by_id", "updated_at")


class _SeriesRow:
    """An AlertSeries row as the round reads and writes it (attribute names = the model's attnames)."""

    def __init__(self, **values):
        self.__dict__.update(values)


def _series_update_many(rows: list[_SeriesRow], names: tuple[str, ...], *, guarded: bool = False) -> None:
    """One prepared UPDATE by primary key, run for every row (executemany): Django's bulk_update
    builds a CASE per field and row, which costs seconds for a few thousand series.

    ``guarded``: each row is written only if its state and ``updated_at`` are still what this
    round read (``row.guard``); when any is not, another evaluator wrote it meanwhile and
    ``_Conflict`` is raised, which rolls the round's transaction back (nothing written twice)."""
    from django.db import connection

    fields = [AlertSeries._meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    sql = (f"UPDATE {quote(AlertSeries._meta.db_table)} SET "
           + ", ".join(f"{quote(f.column)} = %s" for f in fields) + f" WHERE {quote('id')} = %s")

    def values(row):
        return [f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields] + [row.id]

    if not guarded:
        with connection.cursor() as cursor:
            cursor.executemany(sql, [values(row) for row in rows])
        return
    updated_field = AlertSeries._meta.get_field("updated_at")
    seen = [row for row in rows if row.guard[1] is not None]
    never = [row for row in rows if row.guard[1] is None]
    written = 0
    with connection.cursor() as cursor:
        if seen:
            cursor.executemany(sql + f" AND {quote('state')} = %s AND {quote('updated_at')} = %s",
                               [values(row) + [row.guard[0], updated_field.get_db_prep_save(row.guard[1], connection)]
                                for row in seen])
            written += cursor.rowcount
        if never:
            cursor.executemany(sql + f" AND {quote('state')} = %s AND {quote('updated_at')} IS NULL",
                               [values(row) + [row.guard[0]] for row in never])
            written += cursor.rowcount
    if written != len(rows):
        raise _Conflict(f"{len(rows) - written} of {len(rows)} series changed since they were read")


def _rules_health_save(rules: list[AlertRule], errors: dict[int, str], now: datetime) -> None:
    failed = [r.pk for r in rules if r.pk in errors]
    ok = [r.pk for r in rules if r.pk not in errors]
    if ok:
        AlertRule.objects.filter(pk__in=ok).update(last_evaluated_at=now, last_error="")
    for pk in failed:
        AlertRule.objects.filter(pk=pk).update(last_error=errors[pk], last_error_at=now)


# --- grouping and notifications ----------------------------------------------------------------------

def alert_labels(rule: AlertRule, series_labels: dict) -> dict:
    return {"alertname": rule.name, "project": rule.project.name, "severity": rule.severity,
            "metric": rule.metric, **series_labels}


def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when else None


def _alert_payload(rule: AlertRule, series: AlertSeries, status: str) -> dict:
    return {
        "status": status,
        "labels": alert_labels(rule, series.labels),
        "annotations": {"summary": f"{rule.condition} on {series.key or 'project'}",
                        "explanation": rule.explanation, "runbook": rule.runbook},
        "value": None if series.no_data else series.value,
        "noData": series.no_data,
        "startsAt": _iso(series.fired_at),
        "endsAt": _iso(series.resolved_at) if status == "resolved" else None,
        "fingerprint": f"{rule.pk}:{series.key}",
    }


def _payload(rule: AlertRule, channel: NotificationChannel, firing: list[AlertSeries], resolved: list[AlertSeries],
             now: datetime) -> dict:
    alerts = [_alert_payload(rule, s, "firing") for s in firing] + [_alert_payload(rule, s, "resolved") for s in resolved]
    return {
        "version": "1",
        "status": "firing" if firing else "resolved",
        "firing": len(firing),
        "resolved": len(resolved),
        "groupKey": f"{rule.project_id}:{rule.pk}:{channel.pk}",
        "project": {"id": rule.project_id, "name": rule.project.name},
        "rule": {"id": rule.pk, "name": rule.name, "metric": rule.metric, "condition": rule.condition,
                 "severity": rule.severity, "window_seconds": rule.window_seconds, "for_seconds": rule.for_seconds,
                 "runbook": rule.runbook, "explanation": rule.explanation},
        "alerts": alerts,
        "url": settings.TRACEDASH_PUBLIC_URL.rstrip("/") + f"/alerts/?project={rule.project_id}" if settings.TRACEDASH_PUBLIC_URL else "",
        "sentAt": _iso(now),
    }


def _notifications_plan(rules: list[AlertRule], errors: dict[int, str], now: datetime,
                        series_by_rule: dict[int, dict]) -> list[int]:
    """Alertmanager's grouping, per (rule, channel): the first notification of a group after
    ``group_wait``; a change (new firing series, resolved ones) at most every ``group_interval``;
    an unchanged firing group again after ``repeat_interval`` unless every alert is acknowledged.
    Silenced series are left out. Two notifications of one group are never closer than
    ``group_interval``, so a flapping series cannot cause a storm."""
    with_channels = [r for r in rules if r.pk not in errors]
    if not with_channels:
        return []
    channels_by_rule: dict[int, list[NotificationChannel]] = defaultdict(list)
    links = list(AlertRule.channels.through.objects.filter(alertrule_id__in=[r.pk for r in with_channels])
                 .values_list("alertrule_id", "notificationchannel_id"))
    channels = {c.pk: c for c in NotificationChannel.objects.filter(pk__in={c for _, c in links}, enabled=True)}
    for rule_id, channel_id in links:
        if channel_id in channels:
            channels_by_rule[rule_id].append(channels[channel_id])
    rules_used = [r for r in with_channels if channels_by_rule.get(r.pk)]
    if not rules_used:
        return []
    groups = {(g.rule_id, g.channel_id): g for g in NotificationGroup.objects.filter(rule__in=[r.pk for r in rules_used])}
    silences_by_project: dict[int, list[Silence]] = defaultdict(list)
    for silence in Silence.objects.filter(project_id__in={r.project_id for r in rules_used}, starts_at__lte=now, ends_at__gt=now):
        silences_by_project[silence.project_id].append(silence)
    created: list[int] = []
    for rule in rules_used:
        series = series_by_rule.get(rule.pk, {})
        firing = {k: s for k, s in series.items() if s.state == FIRING
                  and not silenced(silences_by_project[rule.project_id], alert_labels(rule, s.labels), now)}
        for channel in channels_by_rule[rule.pk]:
            group = groups.get((rule.pk, channel.pk))
            if group is None:
                if not firing:
                    continue
                group, _ = NotificationGroup.objects.get_or_create(rule=rule, channel=channel)
            sent = set(group.last_sent_keys)
            resolved_keys = {k for k in sent - firing.keys() if k not in series or series[k].state != FIRING}
            current = set(firing)
            if not current and not resolved_keys:
                if sent or group.first_active_at:  # what was sent got silenced: drop it quietly
                    _group_save(group, first_active_at=None, last_sent_keys=[])
                continue
            first_active_at = group.first_active_at or now
            since_last = None if group.last_sent_at is None else (now - group.last_sent_at).total_seconds()
            throttled = since_last is not None and since_last < channel.group_interval_seconds
            if not sent:
                due = (now - first_active_at).total_seconds() >= channel.group_wait_seconds and not throttled
            elif current != sent or resolved_keys:
                due = not throttled
            else:
                all_acked = all(firing[k].acknowledged_at is not None for k in current)
                due = not all_acked and since_last is not None and since_last >= channel.repeat_interval_seconds
            if not due:
                if group.first_active_at is None:
                    _group_save(group, first_active_at=first_active_at)
                continue
            resolved = [series[k] for k in sorted(resolved_keys) if k in series]
            if not current and not channel.send_resolved:
                _group_save(group, first_active_at=None, last_sent_keys=[])
                continue
            sequence = group.version + 1
            moved = NotificationGroup.objects.filter(pk=group.pk, version=group.version).update(
                version=sequence, last_sent_at=now, last_sent_keys=sorted(current),
                first_active_at=first_active_at if current else None)
            if moved != 1:
                continue  # another writer sent this group's change already
            notification = Notification.objects.create(
                project_id=rule.project_id, rule=rule, channel=channel, group=group, sequence=sequence,
                group_status="firing" if current else "resolved", firing_count=len(current),
                resolved_count=len(resolved),
                payload=_payload(rule, channel, [firing[k] for k in sorted(current)], resolved, now),
                next_attempt_at=now, created_at=now)
            created.append(notification.pk)
    return created


def _group_save(group: NotificationGroup, **fields) -> None:
    NotificationGroup.objects.filter(pk=group.pk, version=group.version).update(**fields)


# --- delivery --------------------------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _delivery_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tracedash-alert-delivery")
    return _pool


def deliveries_wait(*, timeout: float = 30.0) -> None:
    """Let the notifications this process is sending finish, for at most ``timeout`` seconds (the
    serving process ends with os._exit, which would not wait for them; one cut off is retried at
    the next start, as its row says it was not sent). No wait when none was handed to the pool."""
    pool = _pool
    if pool is None:
        return
    waiter = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, name="tracedash-alert-wait", daemon=True)
    waiter.start()
    waiter.join(timeout)


def _due_ids(now: datetime) -> list[int]:
    return retry_locked(lambda: list(Notification.objects.filter(
        Q(status=Notification.Status.PENDING, next_attempt_at__lte=now)
        | Q(status=Notification.Status.SENDING, claimed_until__lt=now)).order_by("next_attempt_at").values_list("pk", flat=True)[:500]))


def notifications_enqueue_due(*, now: datetime | None = None) -> int:
    """Hand every due notification to delivery without waiting for it."""
    ids = _due_ids(now or timezone.now())
    if not ids:
        return 0
    if settings.CELERY_TASK_ALWAYS_EAGER:
        pool = _delivery_pool()
        for pk in ids:
            pool.submit(_deliver_in_thread, pk)
    else:
        from .tasks import deliver_notification

        for pk in ids:
            deliver_notification.delay(pk)
    return len(ids)


def _deliver_in_thread(pk: int) -> None:
    from django.db import close_old_connections

    try:
        notification_deliver(notification_id=pk)
    except Exception:  # noqa: BLE001 - logged; the next round's sweep retries it
        log.exception("delivering alert notification %s failed", pk)
    finally:
        close_old_connections()


def notifications_deliver_due(*, now: datetime | None = None) -> int:
    """Deliver every due notification here and now (tests and the benchmark)."""
    ids = _due_ids(now or timezone.now())
    for pk in ids:
        notification_deliver(notification_id=pk, now=now)
    return len(ids)


def notification_deliver(*, notification_id: int, now: datetime | None = None) -> bool | None:
    """One delivery attempt of one notification, if it is due and nobody else holds it.

    Returns True (sent), False (failed: retried later or given up), None (not ours to send)."""
    now = now or timezone.now()
    # Concurrent rounds (several threads of the embedded server, or workers) claim the same due
    # notifications: the conditional UPDATE lets one win. On SQLite a writer's table lock can answer
    # the others "locked" (the tests' shared-cache database ignores the busy timeout): try again.
    claimed = retry_locked(lambda: Notification.objects.filter(pk=notification_id).filter(
        Q(status=Notification.Status.PENDING, next_attempt_at__lte=now)
        | Q(status=Notification.Status.SENDING, claimed_until__lt=now)).update(
        status=Notification.Status.SENDING, claimed_until=now + timedelta(seconds=CLAIM_SECONDS)))
    if claimed != 1:
        return None
    notification = retry_locked(lambda: Notification.objects.select_related("channel").get(pk=notification_id))
    started = time.perf_counter()
    result = notifiers.send(notification.channel, notification.payload)
    duration_ms = (time.perf_counter() - started) * 1000
    attempts = notification.attempts + 1
    # Sent (or tried): what follows must be written, or the claim's expiry sends it again.
    retry_locked(lambda: DeliveryAttempt.objects.create(
        notification=notification, at=timezone.now(), ok=result.ok, status_code=result.status_code,
        error=result.error[:2000], duration_ms=duration_ms))
    if result.ok:
        retry_locked(lambda: Notification.objects.filter(pk=notification_id).update(
            status=Notification.Status.SENT, attempts=attempts, sent_at=timezone.now(), last_error="",
            claimed_until=None))
        return True
    if not result.retryable or attempts >= MAX_ATTEMPTS:
        retry_locked(lambda: Notification.objects.filter(pk=notification_id).update(
            status=Notification.Status.FAILED, attempts=attempts, last_error=result.error[:2000], claimed_until=None))
        log.error("alert notification %s to %s failed for good: %s", notification_id, notification.channel, result.error)
        return False
    delay = BACKOFF_SECONDS[min(attempts - 1, len(BACKOFF_SECONDS) - 1)]
    if result.retry_after is not None:
        delay = max(delay, min(result.retry_after, 3600))
    retry_locked(lambda: Notification.objects.filter(pk=notification_id).update(
        status=Notification.Status.PENDING, attempts=attempts, last_error=result.error[:2000], claimed_until=None,
        next_attempt_at=now + timedelta(seconds=delay)))
    log.warning("alert notification %s to %s failed (attempt %d, retry in %ds): %s", notification_id,
                notification.channel, attempts, delay, result.error)
    return False


# --- live push -------------------------------------------------------------------------------------

def alerts_group(project_id: int) -> str:
    return f"alerts_{int(project_id)}"


def _push_live(project_ids: list[int]) -> None:
    from config.live import group_send

    from .selectors import alerts_firing_payload

    for project_id in project_ids:
        # The page catches up on its next load; a failed push never fails the round.
        group_send(alerts_group(project_id), {"type": "alerts.changed", "firing": alerts_firing_payload(project_id=project_id)})


# --- rules, channels, silences, acknowledgements -------------------------------------------------------

def series_acknowledge(*, series: AlertSeries, user) -> AlertSeries:
    series.acknowledged_at = timezone.now()
    series.acknowledged_by = user
    series.save(update_fields=["acknowledged_at", "acknowledged_by"])
    return series


def silence_create(*, project, matchers, starts_at: datetime, ends_at: datetime, comment: str = "",
                   user=None) -> Silence:
    clean = matchers_validate(matchers)
    if ends_at <= starts_at:
        from .silences import MatcherError

        raise MatcherError("ends_at: the silence must end after it starts")
    return Silence.objects.create(project=project, matchers=clean, starts_at=starts_at, ends_at=ends_at,
                                  comment=comment, created_by=user)


def silence_expire(*, silence: Silence) -> None:
    now = timezone.now()
    if silence.ends_at > now:
        silence.ends_at = max(now, silence.starts_at)
        silence.save(update_fields=["ends_at"])


def channel_create(*, project, name: str, kind: str, url: str = "", secret: str = "", emails: str = "",
                   **timers) -> NotificationChannel:
    return NotificationChannel.objects.create(project=project, name=name, kind=kind, url=url, secret=secret,
                                              emails=emails, **timers)


def channel_test_payload(*, channel: NotificationChannel, now: datetime | None = None) -> dict:
    """A notification in the channel's real format about a made-up firing alert, marked as a test."""
    now = now or timezone.now()
    project = channel.project
    rule = {"id": 0, "name": "Test notification", "metric": "test", "condition": "a test from the alerts page",
            "severity": "info", "window_seconds": 0, "for_seconds": 0, "runbook": "",
            "explanation": "Sent by \"Send test notification\" on the tracedash alerts page: the channel works."}
    labels = {"alertname": rule["name"], "project": project.name, "severity": "info", "metric": "test", "test": "true"}
    return {
        "version": "1", "status": "firing", "firing": 1, "resolved": 0, "test": True,
        "groupKey": f"{project.pk}:test:{channel.pk}", "project": {"id": project.pk, "name": project.name},
        "rule": rule,
        "alerts": [{"status": "firing", "labels": labels,
                    "annotations": {"summary": "tracedash test notification", "explanation": rule["explanation"],
                                    "runbook": ""},
                    "value": None, "noData": False, "startsAt": _iso(now), "endsAt": None,
                    "fingerprint": f"test:{channel.pk}"}],
        "url": settings.TRACEDASH_PUBLIC_URL.rstrip("/") + f"/alerts/?project={project.pk}" if settings.TRACEDASH_PUBLIC_URL else "",
        "sentAt": _iso(now),
    }


def channel_send_test(*, channel: NotificationChannel) -> notifiers.SendResult:
    """One delivery attempt of a test notification (no retry, no history row: the answer is shown)."""
    result = notifiers.send(channel, channel_test_payload(channel=channel))
    log.info("test notification to channel %s: %s", channel.pk, "delivered" if result.ok else result.error)
    return result


def rule_create(*, project, channels=(), **fields) -> AlertRule:
    rule = AlertRule(project=project, **fields)
    rule.full_clean(exclude=["project"])
    rule.save()
    if channels:
        rule.channels.set(channels)
    return rule


# The field's rules of thumb, installed for every new project. Every one has a `for`: a single
# sample never fires it (docs/alerts.md). `info` rules show on the alerts page only: never in the
# banner, and they notify only through channels a user adds to them. The inference-share rule is
# installed switched off: for most LLM apps inference is most of the latency (the demo's is ~80 %),
# so on by default it would be firing on every healthy install; the overview and the trace page
# show the share against its 60 % line anyway, and a user who wants the alert switches it on.
# The inference engines' rules (docs/engines.md). alerts/migrations/0004 installs them in projects made before them.
ENGINE_DEFAULT_RULES = (
    dict(name="Engine KV cache > 90 % for 1 min", metric="engine_kv_cache_percent", aggregation="last",
         window_seconds=60, comparator="gt", threshold=90, for_seconds=60, keep_firing_for_seconds=60,
         severity="warning",
         explanation="An engine's KV cache above 90 % for a whole minute: new requests wait for room and running "
                     "ones are preempted (recomputed later), so time to first token climbs with load.",
         runbook="See the Engines page: waiting requests and preemptions rising with it confirm it. Add a replica, "
                 "lower max-num-seqs / max model length, or give the engine more GPU memory "
                 "(gpu-memory-utilization), a quantised KV cache or a smaller model."),
    dict(name="Engine waiting requests > 10 for 1 min", metric="engine_requests_waiting", aggregation="last",
         window_seconds=60, comparator="gt", threshold=10, for_seconds=60, keep_firing_for_seconds=60,
         severity="warning",
         explanation="More than 10 requests queued in an engine for a whole minute: it takes requests faster "
                     "than it finishes them, and every queued request's TTFT includes the wait.",
         runbook="Compare engine-side and app-side TTFT on the Engines page; scale out or shed load (priority tiers)."),
    dict(name="Engine TTFT P95 > 1000 ms", metric="engine_ttft_p95_ms", aggregation="window", window_seconds=300,
         comparator="gt", threshold=1000, for_seconds=300, keep_firing_for_seconds=60, severity="warning",
         explanation="The engine's own time to first token (arrival to first token, its queue included) above its "
                     "target of 1 s at P95 for 5 minutes: users wait before anything appears. Set the threshold to "
                     "your engine's TTFT target."),
)

DEFAULT_RULES = (
    dict(name="GPU memory ≥ 85 %", metric="gpu_memory_percent", aggregation="last", window_seconds=60,
         comparator="gte", threshold=85, for_seconds=60, keep_firing_for_seconds=60, severity="critical",
         explanation="GPU memory % = used / total from NVML nvmlDeviceGetMemoryInfo. At 85 % or more for a minute: "
                     "scale out before out-of-memory errors (the next larger batch or longer context may not fit).",
         runbook="Check the Resources page for the GPU and its processes; add a replica or lower max batch size / "
                 "context length; look for a leaking process (leak ratio rule)."),
    dict(name="Host CPU > 70 % for 5 min", metric="host_cpu_percent", aggregation="avg", window_seconds=60,
         comparator="gt", threshold=70, for_seconds=300, keep_firing_for_seconds=60, severity="warning",
         explanation="A host busy above 70 % for five minutes means pre/post-processing (tokenising, parsing, "
                     "serialising) competes with serving and needs optimising or more cores."),
    dict(name="GPU utilisation < 50 % for 30 min", metric="gpu_utilization", aggregation="avg", window_seconds=300,
         comparator="lt", threshold=50, for_seconds=1800, keep_firing_for_seconds=0, severity="info",
         explanation="A GPU below 50 % busy for half an hour while serving: batching or resource allocation is "
                     "inefficient — larger batches or fewer GPUs would do the same work."),
    dict(name="Process GPU memory > 1.5× baseline (leak)", metric="process_leak_ratio", aggregation="window",
         window_seconds=120, comparator="gt", threshold=1.5, for_seconds=300, keep_firing_for_seconds=0,
         severity="warning",
         explanation="A process holding 1.5× the GPU memory it used in its first 10 minutes keeps growing: a leak "
                     "(cached tensors, a growing KV cache) that ends in out-of-memory."),
    dict(name="P95 end-to-end > 1500 ms", metric="e2e_p95_ms", aggregation="window", window_seconds=300,
         comparator="gt", threshold=1500, for_seconds=300, keep_firing_for_seconds=60, severity="warning",
         explanation="Over 1.5 s at the 95th percentile of a chat request, users feel the wait."),
    dict(name="Inference share > 60 %", metric="phase_share_percent", phase="inference", aggregation="window",
         window_seconds=300, comparator="gt", threshold=60, for_seconds=300, keep_firing_for_seconds=0,
         severity="info", enabled=False,
         explanation="When inference is more than 60 % of end-to-end time, the model, not the app, dominates "
                     "latency: a smaller/faster model, quantisation or speculative decoding pays most. Off by "
                     "default: for most LLM apps this is normal; switch it on to watch for it."),
    dict(name="Network P95 > 200 ms", metric="network_p95_ms", aggregation="window", window_seconds=300,
         comparator="gt", threshold=200, for_seconds=300, keep_firing_for_seconds=0, severity="warning",
         explanation="Network time above 200 ms at P95 means the region or the connection is wrong "
                     "(a far-away endpoint, no connection reuse)."),
    *ENGINE_DEFAULT_RULES,
)


def default_rules_install(*, project) -> list[AlertRule]:
    """The rules of thumb for a project (idempotent: a rule of that name is left as it is)."""
    made = []
    for spec in DEFAULT_RULES:
        rule, created = AlertRule.objects.get_or_create(project=project, name=spec["name"],
                                                        defaults={**spec, "is_default": True})
        if created:
            made.append(rule)
    return made
