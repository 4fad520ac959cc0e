"""The form that starts a load test from the Load tests page."""

from __future__ import annotations

from urllib.parse import urlsplit

from django import forms

MAX_QPS = 1000.0
MIN_DURATION_S, MAX_DURATION_S = 10.0, 3600.0


class LoadTestStartForm(forms.Form):
    test_type = forms.ChoiceField(label="Type", choices=[
        ("concurrency", "Concurrency: a constant rate"),
        ("step", "Step: rising rate, finds the knee"),
        ("burst", "Burst: 3× the rate, measures recovery")])
    qps = forms.FloatField(label="Rate (QPS)", min_value=0.1, max_value=MAX_QPS, initial=10,
                           help_text="requests per second; step and burst: the baseline")
    duration = forms.FloatField(label="Duration (s)", min_value=MIN_DURATION_S, max_value=MAX_DURATION_S, initial=60,
                                help_text="the whole test; step: 10 steps of a tenth each")
    target = forms.ChoiceField(label="Target", widget=forms.RadioSelect, initial="simulator", choices=[
        ("simulator", "the built-in simulator"), ("url", "an OpenAI-compatible URL")])
    target_url = forms.CharField(label="Base URL", required=False, max_length=500,
                                 help_text="e.g. http://127.0.0.1:8100/v1 (POSTs to …/chat/completions)")
    target_api_key = forms.CharField(label="Target API key", required=False, max_length=500,
                                     widget=forms.PasswordInput(render_value=False),
                                     help_text="optional bearer key of the target; used for this run, never stored")
    model = forms.CharField(label="Model", required=False, max_length=200, help_text="default: sim-gpt")

    def clean_target_url(self):
        value = self.cleaned_data.get("target_url", "").strip()
        if not value:
            return ""
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise forms.ValidationError(f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8100/v1")
        return value.rstrip("/")

    def clean_model(self):
        return self.cleaned_data.get("model", "").strip()

    def clean(self):
        data = super().clean()
        if data.get("target") == "url" and not data.get("target_url") and "target_url" not in self.errors:
            self.add_error("target_url", "the target is a URL: give the OpenAI-compatible base URL, "
                                         "e.g. http://127.0.0.1:8100/v1")
        if data.get("target") == "simulator":
            data["target_url"], data["target_api_key"] = "", ""
        return data
