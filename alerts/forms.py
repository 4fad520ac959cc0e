from __future__ import annotations

import re
from datetime import timedelta

from django import forms
from django.utils import timezone

from .models import LATENCY_METRICS, Aggregation, AlertRule, Metric, NotificationChannel
from .silences import MatcherError, matchers_validate


class RuleForm(forms.ModelForm):
    class Meta:
        model = AlertRule
        fields = ["name", "metric", "aggregation", "phase", "window_seconds", "comparator", "threshold", "host",
                  "gpu_index", "service", "model", "for_seconds", "keep_firing_for_seconds", "missing_data",
                  "missing_grace_seconds", "severity", "channels", "runbook", "explanation", "enabled"]
        widgets = {"runbook": forms.Textarea(attrs={"rows": 3}), "explanation": forms.Textarea(attrs={"rows": 2}),
                   "channels": forms.CheckboxSelectMultiple}

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.instance.project = project
        self.fields["channels"].queryset = NotificationChannel.objects.filter(project=project)

    def clean(self):
        data = super().clean()
        metric = data.get("metric")
        if metric in LATENCY_METRICS:
            data["aggregation"] = Aggregation.WINDOW
        elif data.get("aggregation") == Aggregation.WINDOW and metric != Metric.PROCESS_LEAK_RATIO:
            self.add_error("aggregation", "resource metrics need latest, average, maximum or minimum")
        if metric == Metric.PHASE_SHARE and not data.get("phase"):
            data["phase"] = "inference"
        window = data.get("window_seconds")
        if window is not None and not 10 <= window <= 24 * 3600:
            self.add_error("window_seconds", "the window must be from 10 seconds to 24 hours")
        name = data.get("name")
        if name and AlertRule.objects.filter(project=self.project, name=name).exclude(pk=self.instance.pk).exists():
            self.add_error("name", "this project already has a rule of that name")
        return data


class ChannelForm(forms.ModelForm):
    url = forms.URLField(required=False, max_length=2000, assume_scheme="https",
                         help_text="webhook and Slack channels")

    class Meta:
        model = NotificationChannel
        fields = ["name", "kind", "url", "secret", "emails", "group_wait_seconds", "group_interval_seconds",
                  "repeat_interval_seconds", "send_resolved", "enabled"]

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.instance.project = project

    def clean(self):
        data = super().clean()
        kind = data.get("kind")
        if kind in ("webhook", "slack") and not data.get("url"):
            self.add_error("url", "a webhook URL is required")
        if kind == "email":
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
    matchers = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}),
                               help_text="one per line: label=value, label!=value, label=~regex, label!~regex")
    hours = forms.FloatField(min_value=0.05, max_value=24 * 90, initial=2)
    comment = forms.CharField(max_length=500, required=False)

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
