"""Sending one notification: JSON webhook (HMAC-signed), Slack-compatible webhook, email.

``send(channel, payload)`` makes ONE attempt and returns a ``SendResult``; retries with backoff
are the caller's (alerts.services.notification_deliver), so an attempt never sleeps.

Webhook signature: ``X-Tracedash-Signature: sha256=<hex>`` where hex is HMAC-SHA256 with the
channel's secret over ``<X-Tracedash-Timestamp>.<body bytes>``; a receiver recomputes it and
rejects old timestamps (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import send_mail

USER_AGENT = "tracedash-alerts/1"
SIGNATURE_HEADER = "X-Tracedash-Signature"
TIMESTAMP_HEADER = "X-Tracedash-Timestamp"
RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status_code: int | None = None
    error: str = ""
    retryable: bool = True
    retry_after: float | None = None


def signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# Labels read in this order whatever the database did to the JSON (PostgreSQL's jsonb reorders keys).
LABEL_ORDER = ("host", "gpu", "pid", "process", "service", "model")


def labels_text(labels: dict, *, skip: tuple[str, ...] = ()) -> str:
    keys = sorted((k for k in labels if k not in skip),
                  key=lambda k: (LABEL_ORDER.index(k) if k in LABEL_ORDER else len(LABEL_ORDER), k))
    return ", ".join(f"{k}={labels[k]}" for k in keys)


def slack_message(payload: dict) -> dict:
    """Slack incoming-webhook format: ``text`` (shown in notifications) plus one attachment per alert."""
    status = payload["status"]
    rule = payload["rule"]
    icon = ":rotating_light:" if status == "firing" else ":white_check_mark:"
    head = f"{icon} [{status.upper()}{':' + str(payload['firing']) if status == 'firing' else ''}] " \
           f"{rule['name']} ({payload['project']['name']})"
    attachments = []
    for alert in payload["alerts"]:
        labels = labels_text(alert["labels"], skip=("alertname", "project", "severity", "metric"))
        value = "no data" if alert["value"] is None else f"{alert['value']:g}"
        attachments.append({
            "color": "danger" if alert["status"] == "firing" else "good",
            "title": f"{alert['status']}: {labels or rule['name']}",
            "text": f"{rule['condition']} — value {value}",
            "fields": [{"title": "severity", "value": rule["severity"], "short": True},
                       {"title": "since", "value": alert["startsAt"] or "", "short": True}],
        })
    if rule.get("runbook"):
        attachments.append({"title": "Runbook", "text": rule["runbook"]})
    return {"text": head, "attachments": attachments}


def email_message(payload: dict) -> tuple[str, str]:
    rule = payload["rule"]
    subject = f"[tracedash {payload['status'].upper()}] {rule['name']} ({payload['project']['name']})"
    lines = [f"{rule['condition']} (severity {rule['severity']})", ""]
    for alert in payload["alerts"]:
        labels = labels_text(alert["labels"])
        value = "no data" if alert["value"] is None else f"{alert['value']:g}"
        lines.append(f"- {alert['status']}: {labels} value {value} since {alert['startsAt']}"
                     + (f" until {alert['endsAt']}" if alert["endsAt"] else ""))
    if rule.get("explanation"):
        lines += ["", "Why it matters: " + rule["explanation"]]
    if rule.get("runbook"):
        lines += ["", "Runbook:", rule["runbook"]]
    if payload.get("url"):
        lines += ["", payload["url"]]
    return subject, "\n".join(lines)


def _post(url: str, body: bytes, headers: dict, timeout: float) -> SendResult:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": USER_AGENT, **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the user's own endpoint
            response.read(65536)
            return SendResult(ok=True, status_code=response.status)
    except urllib.error.HTTPError as exc:
        retry_after = None
        raw = exc.headers.get("Retry-After") if exc.headers else None
        if raw and raw.strip().isdigit():
            retry_after = float(raw.strip())
        detail = exc.read(500).decode(errors="replace") if exc.fp else ""
        return SendResult(ok=False, status_code=exc.code, error=f"HTTP {exc.code}: {detail}".strip(),
                          retryable=exc.code in RETRYABLE_STATUS, retry_after=retry_after)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return SendResult(ok=False, error=f"{type(exc).__name__}: {reason}")


def send(channel, payload: dict, *, timeout: float | None = None) -> SendResult:
    timeout = timeout or settings.TRACEDASH_ALERTS_DELIVERY_TIMEOUT
    if channel.kind == "webhook":
        body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        headers = {}
        if channel.secret:
            ts = str(int(time.time()))
            headers = {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: signature(channel.secret, ts, body)}
        return _post(channel.url, body, headers, timeout)
    if channel.kind == "slack":
        return _post(channel.url, json.dumps(slack_message(payload)).encode(), {}, timeout)
    if channel.kind == "email":
        recipients = channel.email_list()
        if not recipients:
            return SendResult(ok=False, error="the channel lists no email address", retryable=False)
        subject, text = email_message(payload)
        try:
            send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)
        except Exception as exc:  # noqa: BLE001 - SMTP errors of any kind: recorded and retried
            return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}")
        return SendResult(ok=True)
    return SendResult(ok=False, error=f"unknown channel kind {channel.kind!r}", retryable=False)
