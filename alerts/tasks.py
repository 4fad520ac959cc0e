"""Celery tasks: thin wrappers over alerts.services."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(name="alerts.tasks.evaluate", ignore_result=True)
def evaluate() -> dict:
    """One evaluation round (beat entry ``alerts-evaluate``); skipped when another worker holds it."""
    report = services.alerts_evaluate_round()
    return {"skipped": report.skipped, "rules": report.rules, "transitions": report.transitions,
            "notifications": len(report.notifications), "errors": len(report.errors), "seconds": report.seconds}


@shared_task(name="alerts.tasks.deliver_notification", ignore_result=True)
def deliver_notification(notification_id: int) -> bool | None:
    return services.notification_deliver(notification_id=notification_id)
