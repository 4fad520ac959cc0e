"""Reads for alerts (metadata DB) and the rule editor's preview series (ClickHouse)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from server.leases import lease_name

from .models import (AlertEvent, AlertRule, AlertSeries, EvaluationLease, Notification, NotificationChannel,
                     SeriesState, Silence)
from .services import LEASE_NAME, alert_labels
from .silences import silenced


def alerts_firing(*, project_id: int) -> list[AlertSeries]:
    """The project's firing alert series, most recent first (rule loaded). Used by the banner
    and by the overview/resources charts to link a firing alert."""
    return list(AlertSeries.objects.filter(project_id=project_id, state=SeriesState.FIRING)
                .select_related("rule", "rule__project").order_by("-fired_at", "pk"))


def alerts_firing_payload(*, project_id: int) -> list[dict]:
    """JSON-ready firing alerts (the live banner's push and its server-side first render)."""
    now = timezone.now()
    silences = silences_active(project_id=project_id, now=now)
    out = []
    for s in alerts_firing(project_id=project_id):
        out.append({
            "rule_id": s.rule_id, "rule": s.rule.name, "severity": s.rule.severity, "series": s.key,
            "labels": s.labels, "value": None if s.no_data else s.value, "no_data": s.no_data,
            "since": s.fired_at.isoformat() if s.fired_at else None,
            "acknowledged": s.acknowledged_at is not None,
            "silenced": silenced(silences, alert_labels(s.rule, s.labels), now),
        })
    return out


def silences_active(*, project_id: int, now: datetime | None = None) -> list[Silence]:
    now = now or timezone.now()
    return list(Silence.objects.filter(project_id=project_id, starts_at__lte=now, ends_at__gt=now))


def alerts_overview(*, project_id: int) -> dict:
    """What /alerts/ shows: firing, pending and silenced series, rules with their health."""
    now = timezone.now()
    silences = silences_active(project_id=project_id, now=now)
    active = list(AlertSeries.objects.filter(project_id=project_id, state__in=[SeriesState.FIRING, SeriesState.PENDING])
                  .select_related("rule", "rule__project", "acknowledged_by").order_by("-fired_at", "-active_since"))
    firing, pending, silenced_rows = [], [], []
    for s in active:
        if silenced(silences, alert_labels(s.rule, s.labels), now):
            silenced_rows.append(s)
        elif s.state == SeriesState.FIRING:
            firing.append(s)
        else:
            pending.append(s)
    no_data = list(AlertSeries.objects.filter(project_id=project_id, no_data=True)
                   .exclude(state__in=[SeriesState.FIRING, SeriesState.PENDING]).select_related("rule")[:100])
    return {
        "firing": firing, "pending": pending, "silenced": silenced_rows, "no_data": no_data,
        "rules": list(AlertRule.objects.filter(project_id=project_id).prefetch_related("channels")),
        "channels": list(NotificationChannel.objects.filter(project_id=project_id)),
        "silences": list(Silence.objects.filter(project_id=project_id, ends_at__gt=now - timedelta(days=1))),
        "events": list(AlertEvent.objects.filter(project_id=project_id).select_related("rule")[:100]),
        "evaluation": EvaluationLease.objects.filter(name=lease_name(LEASE_NAME, project_id)).first(),
        "notifications": list(Notification.objects.filter(project_id=project_id)
                              .select_related("rule", "channel").prefetch_related("attempt_log")[:50]),
    }


def rule_for_project(*, project_id: int, rule_id) -> AlertRule | None:
    try:
        return AlertRule.objects.filter(project_id=project_id, pk=int(rule_id)).first()
    except (TypeError, ValueError):
        return None


def series_for_project(*, project_id: int, series_id) -> AlertSeries | None:
    try:
        return AlertSeries.objects.filter(project_id=project_id, pk=int(series_id)).select_related("rule").first()
    except (TypeError, ValueError):
        return None


def silence_for_project(*, project_id: int, silence_id) -> Silence | None:
    try:
        return Silence.objects.filter(project_id=project_id, pk=int(silence_id)).first()
    except (TypeError, ValueError):
        return None


def channels_for_project(*, project_id: int) -> QuerySet[NotificationChannel]:
    return NotificationChannel.objects.filter(project_id=project_id)
