"""The alerts pages: thin views over alerts.selectors and alerts.services."""

from __future__ import annotations

import logging

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from projects.scope import current_project
from store import StoreError

from . import selectors, services
from .forms import ChannelForm, RuleForm, SilenceForm
from .models import AlertRule
from .preview import rule_preview_figure

log = logging.getLogger("tracedash.alerts")


def _project_or_404(request):
    project = current_project(request)
    if project is None:
        raise Http404("No project")
    return project


def _back(project):
    return redirect(f"{reverse('alerts:index')}?project={project.pk}")


@login_required
def alerts_page(request):
    project = current_project(request)
    overview = selectors.alerts_overview(project_id=project.pk) if project else None
    context = {"overview": overview,
               # the empty page's card names the rules of thumb that watch the project
               "default_rules_on": [r for r in overview["rules"] if r.is_default and r.enabled] if overview else [],
               "channel_form": ChannelForm(project=project) if project else None,
               "silence_form": SilenceForm(initial={"matchers": request.GET.get("silence", "")}) if project else None}
    return render(request, "alerts/index.html", context)


@login_required
def firing_json(request):
    project = _project_or_404(request)
    return JsonResponse({"project": project.pk, "firing": selectors.alerts_firing_payload(project_id=project.pk)})


@login_required
def rule_edit(request, rule_id=None):
    project = _project_or_404(request)
    rule = None
    if rule_id is not None:
        rule = selectors.rule_for_project(project_id=project.pk, rule_id=rule_id)
        if rule is None:
            raise Http404("No such rule")
    if request.method == "POST" and "preview" in request.POST:
        # Preview is a POST too (the form carries the CSRF token: never put it in a URL); nothing is saved.
        form = RuleForm(request.POST, instance=rule, project=project)
        form.is_valid()
    elif request.method == "POST":
        form = RuleForm(request.POST, instance=rule, project=project)
        if form.is_valid():
            saved = form.save()
            messages.success(request, f"Rule {saved.name!r} saved.")
            return _back(project)
    else:
        form = RuleForm(instance=rule, project=project)
    figure, preview_error = None, ""
    candidate = _candidate(form, rule, project)
    if candidate is not None:
        try:
            figure = rule_preview_figure(rule=candidate)
        except StoreError as exc:
            log.error("rule preview failed: %s", exc)
            preview_error = "The trace store is unavailable right now; the preview will come back with it."
    return render(request, "alerts/rule_edit.html",
                  {"form": form, "rule": rule, "figure": figure, "preview_error": preview_error})


def _candidate(form, rule, project) -> AlertRule | None:
    """The rule as the form stands (for the preview), or the saved rule, or None."""
    data = getattr(form, "cleaned_data", None)
    if data and data.get("metric") and data.get("threshold") is not None and data.get("window_seconds"):
        fields = {k: v for k, v in data.items() if k != "channels" and hasattr(AlertRule, k)}
        return AlertRule(project=project, **fields)
    return rule


@login_required
@require_POST
def rule_delete(request, rule_id):
    project = _project_or_404(request)
    rule = selectors.rule_for_project(project_id=project.pk, rule_id=rule_id)
    if rule is None:
        raise Http404("No such rule")
    rule.delete()
    messages.success(request, f"Rule {rule.name!r} deleted.")
    return _back(project)


@login_required
@require_POST
def channel_new(request):
    project = _project_or_404(request)
    form = ChannelForm(request.POST, project=project)
    if form.is_valid():
        form.save()
        messages.success(request, f"Channel {form.instance.name!r} added.")
    else:
        messages.error(request, "Channel not added: " + "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()))
    return _back(project)


@login_required
@require_POST
def channel_delete(request, channel_id):
    project = _project_or_404(request)
    channel = selectors.channels_for_project(project_id=project.pk).filter(pk=channel_id).first()
    if channel is None:
        raise Http404("No such channel")
    channel.delete()
    return _back(project)


@login_required
@require_POST
def channel_test(request, channel_id):
    """Send a test notification to a channel now; the result (delivered, or the error) is shown."""
    project = _project_or_404(request)
    channel = selectors.channels_for_project(project_id=project.pk).filter(pk=channel_id).first()
    if channel is None:
        raise Http404("No such channel")
    result = services.channel_send_test(channel=channel)
    if result.ok:
        status = f" (HTTP {result.status_code})" if result.status_code else ""
        messages.success(request, f"Test notification to {channel.name!r} delivered{status}.")
    else:
        messages.error(request, f"Test notification to {channel.name!r} failed: {result.error or 'no answer'}")
    return _back(project)


@login_required
@require_POST
def silence_new(request):
    project = _project_or_404(request)
    form = SilenceForm(request.POST)
    if form.is_valid():
        starts, ends = form.window()
        services.silence_create(project=project, matchers=form.cleaned_data["matchers"], starts_at=starts, ends_at=ends,
                                comment=form.cleaned_data["comment"], user=request.user)
        messages.success(request, "Silence created.")
    else:
        messages.error(request, "Silence not created: " + "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()))
    return _back(project)


@login_required
@require_POST
def silence_expire(request, silence_id):
    project = _project_or_404(request)
    silence = selectors.silence_for_project(project_id=project.pk, silence_id=silence_id)
    if silence is None:
        raise Http404("No such silence")
    services.silence_expire(silence=silence)
    return _back(project)


@login_required
@require_POST
def series_ack(request, series_id):
    project = _project_or_404(request)
    series = selectors.series_for_project(project_id=project.pk, series_id=series_id)
    if series is None:
        raise Http404("No such alert")
    services.series_acknowledge(series=series, user=request.user)
    messages.success(request, f"Acknowledged {series.rule.name} {series.key}.")
    return _back(project)
