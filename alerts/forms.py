from __future__ import annotations

import json
import re
from datetime import timedelta
from urllib.parse import urlsplit

from django import forms
from django.utils import timezone

from .models import LATENCY_METRICS, WINDOW_METRICS, Aggregation, AlertRule, Metric, NotificationChannel, Phase
from .silences import MatcherError, matchers_validate


# The unit of each metric's threshold, shown beside the threshold field (and by
# static/tracedash/alerts-rule-form.js when the metric changes).
METRIC_UNITS = {
    Metric.GPU_MEMORY_PERCENT: "%", Metric.GPU_UTILIZATION: "%", Metric.GPU_TEMPERATURE: "°C",
    Metric.HOST_CPU_PERCENT: "%", Metric.HOST_MEMORY_PERCENT: "%", Metric.PROCESS_LEAK_RATIO: "× baseline",
    Metric.E2E_P50: "ms", Metric.E2E_P95: "ms", Metric.E2E_P99: "ms", Metric.TTFT_P95: "ms",
    Metric.PHASE_SHARE: "%", Metric.NETWORK_P95: "ms", Metric.ERROR_RATE: "%", Metric.REQUEST_RATE: "requests/s",
}
MAX_MINUTES = 7 * 24 * 60


def _minutes(seconds) -> float | int:
    minutes = (seconds or 0) / 60
    return int(minutes) if minutes == int(minutes) else round(minutes, 2)


class RuleForm(forms.ModelForm):
    """The rule editor. Durations a person thinks of in minutes (``for``, keep firing, no-data
    grace) are entered in minutes and stored in seconds; the window stays in seconds."""

    for_minutes = forms.FloatField(
        label="Hold for (minutes)", min_value=0, max_value=MAX_MINUTES, initial=5,
        help_text="the condition must hold this long, observed continuously by samples, before the alert "
                  "fires (0: fires on the first breaching sample); pending until then")
    keep_firing_for_minutes = forms.FloatField(
        label="Keep firing for (minutes)", min_value=0, max_value=MAX_MINUTES, initial=0,
        help_text="once firing, stay firing this long after the condition stops (rides out short dips)")
    missing_grace_minutes = forms.FloatField(
        label="Resolve after no data for (minutes)", min_value=0.5, max_value=MAX_MINUTES, initial=5,
        help_text="a host, GPU or service that stops reporting this long resolves (its series is stale)")

    class Meta:
        model = AlertRule
        fields = ["name", "metric", "aggregation", "phase", "window_seconds", "comparator", "threshold", "host",
                  "gpu_index", "service", "model", "group_by", "group_value", "missing_data", "severity", "channels", "runbook",
                  "explanation", "enabled"]
        labels = {
            "name": "Name", "metric": "Metric", "aggregation": "Combine the window's samples by",
            "phase": "Phase", "window_seconds": "Window (seconds)", "comparator": "Fires when the value is",
            "threshold": "Threshold", "host": "Host", "gpu_index": "GPU number", "service": "Service",
            "model": "Model", "group_by": "Group by attribute", "group_value": "Only the value",
            "missing_data": "When there is no data", "severity": "Severity",
            "channels": "Notify", "runbook": "Runbook", "explanation": "Why it matters", "enabled": "Enabled",
        }
        help_texts = {
            "aggregation": "resource metrics only; latency metrics are already a percentile, share or rate "
                           "over the window",
            "phase": "phase-share rules only",
            "window_seconds": "each evaluation looks at the samples or requests of this many seconds "
                              "(10 s to 24 h)",
            "threshold": "in the metric's unit: % for percentages, ms for latencies, °C, requests/s, or "
                         "× baseline for the leak ratio",
            "host": "blank: every host (one alert per host)",
            "gpu_index": "blank: every GPU (one alert per GPU); 0 is the first GPU of a host",
            "service": "blank: every service (one alert per root service)",
            "model": "latency rules: only requests that called this model; blank: all",
            "group_by": "latency rules: one alert per value of this span or resource attribute (e.g. user.tier) "
                        "instead of per service; blank: per service",
            "group_value": "with a group-by attribute: watch only this value (e.g. premium); blank: every value",
            "severity": "critical and warning show in the red banner on every page; info shows on this "
                        "page only and notifies only through the channels ticked below",
            "channels": "none ticked: the alert shows in tracedash only",
            "runbook": "what to do when it fires (sent with the notification)",
            "explanation": "shown with the rule and in notifications",
        }
        widgets = {"runbook": forms.Textarea(attrs={"rows": 3}), "explanation": forms.Textarea(attrs={"rows": 2}),
                   "channels": forms.CheckboxSelectMultiple}

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.instance.project = project
        self.fields["channels"].queryset = NotificationChannel.objects.filter(project=project)
        self.fields["phase"].choices = [("", "— (not a phase-share rule)"), *Phase.choices]
        self.fields["metric"].choices = [("", "— choose a metric —"), *Metric.choices]
        metric = self.data.get("metric") if self.is_bound else self.instance.metric
        unit = METRIC_UNITS.get(metric) if metric in Metric.values else None
        self.fields["threshold"].label = f"Threshold ({unit})" if unit else "Threshold"
        self.fields["threshold"].widget.attrs.update({"data-units": json.dumps(METRIC_UNITS)})
        self.fields["metric"].widget.attrs.update({"data-rule-metric": "1"})
        if self.instance.pk:
            self.initial.setdefault("for_minutes", _minutes(self.instance.for_seconds))
            self.initial.setdefault("keep_firing_for_minutes", _minutes(self.instance.keep_firing_for_seconds))
            self.initial.setdefault("missing_grace_minutes", _minutes(self.instance.missing_grace_seconds))
        # the minutes fields sit beside the window, not at the end of the form
        order = list(self.fields)
        for name in ("missing_grace_minutes", "keep_firing_for_minutes", "for_minutes"):
            order.remove(name)
            order.insert(order.index("threshold") + 1, name)
        self.order_fields(order)

    def clean(self):
        data = super().clean()
        metric = data.get("metric")
        if metric in WINDOW_METRICS:
            data["aggregation"] = Aggregation.WINDOW
        elif data.get("aggregation") == Aggregation.WINDOW and metric != Metric.PROCESS_LEAK_RATIO:
            self.add_error("aggregation", "resource metrics need latest, average, maximum or minimum")
        if metric == Metric.PHASE_SHARE and not data.get("phase"):
            data["phase"] = "inference"
        group_by, group_value = (data.get("group_by") or "").strip(), (data.get("group_value") or "").strip()
        data["group_by"], data["group_value"] = group_by, group_value
        if group_by and metric and metric not in LATENCY_METRICS:
            self.add_error("group_by", "only latency rules (E2E, TTFT, network, phase share, errors, rate) group by an attribute")
        if group_value and not group_by:
            self.add_error("group_value", "needs a group-by attribute")
        window = data.get("window_seconds")
        if window is not None and not 10 <= window <= 24 * 3600:
            self.add_error("window_seconds", "the window must be from 10 seconds to 24 hours")
        for minutes, seconds in (("for_minutes", "for_seconds"), ("keep_firing_for_minutes", "keep_firing_for_seconds"),
                                 ("missing_grace_minutes", "missing_grace_seconds")):
            if data.get(minutes) is not None:
                data[seconds] = int(round(data[minutes] * 60))
                setattr(self.instance, seconds, data[seconds])
        name = data.get("name")
        if name and AlertRule.objects.filter(project=self.project, name=name).exclude(pk=self.instance.pk).exists():
            self.add_error("name", "this project already has a rule of that name")
        return data


# Which URL schemes each channel kind accepts. Webhook: http or https (a receiver on the local
# network is common). Slack-compatible: https only, any host (Slack's hooks.slack.com, or a
# Mattermost / Rocket.Chat / Discord-slack endpoint); an incoming webhook is never plain http.
CHANNEL_SCHEMES = {"webhook": ("http", "https"), "slack": ("https",)}


class ChannelForm(forms.ModelForm):
    url = forms.URLField(required=False, max_length=2000, assume_scheme="https", label="URL",
                         help_text="webhook: an http(s) URL that receives the JSON; Slack-compatible: the https "
                                   "incoming-webhook URL (https://hooks.slack.com/services/… or your chat "
                                   "server's)")

    class Meta:
        model = NotificationChannel
        fields = ["name", "kind", "url", "secret", "emails", "group_wait_seconds", "group_interval_seconds",
                  "repeat_interval_seconds", "send_resolved", "enabled"]
        labels = {
            "name": "Name", "kind": "Kind", "secret": "Signing secret (webhook)",
            "emails": "Email addresses", "group_wait_seconds": "Wait before the first notification (seconds)",
            "group_interval_seconds": "Least time between notifications of a rule (seconds)",
            "repeat_interval_seconds": "Repeat a still-firing alert every (seconds)",
            "send_resolved": "Notify when resolved", "enabled": "Enabled",
        }
        help_texts = {
            "secret": "webhook channels: the key of the X-Tracedash-Signature HMAC-SHA256 header; blank: unsigned",
            "emails": "email channels: addresses, comma-separated",
            "group_wait_seconds": "0: at once; more collects alerts that fire together into one message",
            "group_interval_seconds": "a flapping alert never sends more often than this",
            "repeat_interval_seconds": "14400 = 4 hours; an acknowledged alert is not repeated",
        }
        widgets = {"secret": forms.PasswordInput(render_value=True)}

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.instance.project = project

    def clean(self):
        data = super().clean()
        kind = data.get("kind")
        url = data.get("url") or ""
        if kind in CHANNEL_SCHEMES:
            schemes = CHANNEL_SCHEMES[kind]
            if not url:
                if "url" not in self.errors:
                    self.add_error("url", "a webhook URL is required")
            elif urlsplit(url).scheme.lower() not in schemes:
                self.add_error("url", f"a {NotificationChannel.Kind(kind).label} URL must start with "
                                      + " or ".join(f"{s}://" for s in schemes))
            elif not urlsplit(url).hostname:
                self.add_error("url", "the URL names no host")
        if kind == "email":
            data["url"] = ""
            emails = [e.strip() for e in (data.get("emails") or "").split(",") if e.strip()]
            if not emails:
                self.add_error("emails", "give at least one address")
            for e in emails:
                try:
                    forms.EmailField().clean(e)
                except forms.ValidationError:
                    self.add_error("emails", f"{e!r} is not an email address")
        name = data.get("name")
        if name and NotificationChannel.objects.filter(project=self.project, name=name).exclude(pk=self.instance.pk).exists():
            self.add_error("name", "this project already has a channel of that name")
        return data


_MATCHER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


class SilenceForm(forms.Form):
    matchers = forms.CharField(label="Matching alerts", widget=forms.Textarea(attrs={"rows": 3}),
                               help_text="one per line, all must match: label=value, label!=value, label=~regex, "
                                         "label!~regex (labels: alertname, severity, host, gpu, service, …)")
    hours = forms.FloatField(label="For (hours)", min_value=0.05, max_value=24 * 90, initial=2,
                             help_text="from now; 0.5 = 30 minutes, up to 90 days")
    comment = forms.CharField(label="Comment", max_length=500, required=False,
                              help_text="why (shown in the list of silences)")

    def clean_matchers(self):
        parsed = []
        for n, line in enumerate(self.cleaned_data["matchers"].splitlines(), 1):
            if not line.strip():
                continue
            m = _MATCHER.match(line)
            if not m:
                raise forms.ValidationError(f"line {n}: expected label=value (or != =~ !~), got {line.strip()!r}")
            parsed.append({"label": m.group(1), "op": m.group(2), "value": m.group(3)})
        try:
            return matchers_validate(parsed)
        except MatcherError as exc:
            raise forms.ValidationError(str(exc)) from None

    def window(self):
        start = timezone.now()
        return start, start + timedelta(hours=self.cleaned_data["hours"])
