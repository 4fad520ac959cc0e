"""The settings page (``/settings/``) and its forms: the current project's retention, ingest keys,
members and indexed attribute keys, and the user's projects.

Every action names its project with ``?project=<id>`` like every other page; a project the user is
not a member of is a 404 (``projects.scope.current_project``), and a key or membership is
looked up inside that project only, so another project's object is a 404 too. A new key's secret is
rendered once, in the answer to the POST that made it (``Cache-Control: no-store``): it is never
stored, put in a URL, the session or a message.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone as dt_timezone

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from analytics import attribute_index
from store.errors import StoreError

from . import selectors, services
from .scope import SESSION_KEY, current_project
from .forms import ApiKeyCreateForm, IndexKeyForm, MemberAddForm, ProjectCreateForm, RetentionForm

TEMPLATE = "dashboard/settings.html"


def _settings_url(project) -> str:
    url = reverse("dashboard:settings")
    return f"{url}?project={project.pk}" if project is not None else url


def _base_url(request) -> str:
    """This server's base URL as the browser reached it (scheme and host, no trailing slash)."""
    return request.build_absolute_uri("/").rstrip("/")


def key_snippets(*, base_url: str, raw_key: str) -> dict[str, str]:
    """Ready-to-paste setup for a new key: the SDK, OpenTelemetry's variables, the Langfuse SDK's
    variables (its key pair: the key's public prefix and the key) and a curl call that sends one
    span (fresh ids, the current time) to this server."""
    now = datetime.now(dt_timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    span = (f'{{"spans": [{{"trace_id": "{secrets.token_hex(16)}", "span_id": "{secrets.token_hex(8)}", '
            f'"name": "hello from curl", "service": "curl", "start_time": "{now}", "duration_ms": 5}}]}}')
    return {
        "sdk": (f"export TRACEDASH_ENDPOINT={base_url}\n"
                f"export TRACEDASH_API_KEY={raw_key}\n"
                "# then, in Python (pip install ./sdk from a tracedash checkout):\n"
                "#   import tracedash_sdk as td\n"
                '#   tracer = td.Tracer(service="my-app")'),
        "otlp": (f"export OTEL_EXPORTER_OTLP_ENDPOINT={base_url}\n"
                 f'export OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20{raw_key}"\n'
                 "export OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"),
        # Both host variables: SDK v5 reads LANGFUSE_BASE_URL first (a stale one would win over
        # LANGFUSE_HOST), earlier v3 releases only LANGFUSE_HOST.
        "langfuse": (f"export LANGFUSE_BASE_URL={base_url}\n"
                     f"export LANGFUSE_HOST={base_url}\n"
                     f"export LANGFUSE_PUBLIC_KEY={services.api_key_public_key(raw_key=raw_key)}\n"
                     f"export LANGFUSE_SECRET_KEY={raw_key}\n"
                     "# then, in Python (pip install langfuse, v3 or later):\n"
                     "#   from langfuse.openai import OpenAI  # or @observe, langfuse.start_as_current_observation"),
        "curl": (f"curl -X POST {base_url}/api/v1/traces \\\n"
                 f'  -H "Authorization: Bearer {raw_key}" -H "Content-Type: application/json" \\\n'
                 f"  -d '{span}'"),
    }


def _indexed_keys(project) -> tuple[list, str]:
    """The project's indexed attribute keys (analytics.attribute_index), or why they cannot be shown:
    they live in ClickHouse, and the rest of this page must render while it is down."""
    try:
        return attribute_index.indexed_keys(project_id=project.pk), ""
    except StoreError as exc:
        return [], f"The indexed keys cannot be read now: ClickHouse did not answer ({exc.__class__.__name__})."


def _render(request, project, *, status=200, retention_form=None, key_form=None, member_form=None,
            project_form=None, member_error=None, new_key=None, created_project=None, index_form=None,
            index_error=None):
    context = {
        "project": project,
        "projects": list(selectors.projects_for_user(user=request.user)),
        "project_form": project_form or ProjectCreateForm(),
        "global_retention_days": int(settings.TRACEDASH_RETENTION_DAYS),
        "created_project": created_project,
    }
    if project is not None:
        from analytics.retention_services import effective_retention_days

        context.update({
            "form": retention_form or RetentionForm(initial={"retention_days": project.retention_days}),
            "saved": request.method == "GET" and request.GET.get("saved") == "1",
            "effective_retention_days": effective_retention_days(retention_days=project.retention_days),
            "api_keys": list(selectors.api_keys_for_project(project=project)),
            "key_form": key_form or ApiKeyCreateForm(),
            "memberships": list(selectors.memberships_for_project(project=project)),
            "member_form": member_form or MemberAddForm(),
            "member_error": member_error,
            "index_form": index_form or IndexKeyForm(),
            "index_error": index_error,
        })
        context["indexed_keys"], context["indexed_keys_unavailable"] = _indexed_keys(project)
        context["index_max_keys"] = attribute_index.MAX_KEYS
    if new_key is not None:
        key, raw = new_key
        context["new_key"] = {"key": key, "raw": raw, "base_url": _base_url(request),
                              "snippets": key_snippets(base_url=_base_url(request), raw_key=raw)}
    response = render(request, TEMPLATE, context, status=status)
    if new_key is not None:
        response["Cache-Control"] = "no-store"  # the secret must not be kept by a cache or the back button
    return response


def _errors_into(form, exc: ValidationError) -> None:
    for field, errors in (exc.message_dict.items() if hasattr(exc, "error_dict") else [(None, exc.messages)]):
        for error in errors:
            form.add_error(field if field in form.fields else None, error)


@login_required
def settings_page(request):
    """``/settings/``: the page, and the retention form's POST (``dashboard.views.project_settings``)."""
    project = current_project(request)
    if project is not None and request.method == "POST":
        form = RetentionForm(request.POST)
        if form.is_valid():
            services.project_retention_update(project=project, retention_days=form.cleaned_data["retention_days"])
            return redirect(f"{_settings_url(project)}&saved=1")
        return _render(request, project, status=400, retention_form=form)
    return _render(request, project)


def _project_or_404(request):
    project = current_project(request)
    if project is None:
        raise Http404("No such project")
    return project


@login_required
@require_POST
def key_create(request):
    project = _project_or_404(request)
    form = ApiKeyCreateForm(request.POST)
    if form.is_valid():
        try:
            key, raw = services.api_key_create(project=project, name=form.cleaned_data["name"])
        except ValidationError as exc:
            _errors_into(form, exc)
        else:
            return _render(request, project, new_key=(key, raw))
    return _render(request, project, status=400, key_form=form)


@login_required
@require_POST
def key_revoke(request, key_id: int):
    project = _project_or_404(request)
    key = selectors.api_key_for_project(project=project, key_id=key_id)
    if key is None:
        raise Http404("No such key")
    services.api_key_revoke(key=key)
    messages.success(request, f"Revoked td_{key.prefix}_… ({key.name}): requests that send it are refused from now on.")
    return redirect(_settings_url(project))


@login_required
@require_POST
def member_add(request):
    project = _project_or_404(request)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            membership = services.membership_add_by_username(project=project, username=form.cleaned_data["username"])
        except ValidationError as exc:
            _errors_into(form, exc)
        else:
            messages.success(request, f"Added {membership.user.get_username()} to {project.name}.")
            return redirect(_settings_url(project))
    return _render(request, project, status=400, member_form=form)


@login_required
@require_POST
def member_remove(request, membership_id: int):
    project = _project_or_404(request)
    membership = selectors.membership_for_project(project=project, membership_id=membership_id)
    if membership is None:
        raise Http404("No such member")
    username = membership.user.get_username()
    try:
        services.membership_remove(membership=membership)
    except ValidationError as exc:
        return _render(request, project, status=400, member_error=" ".join(exc.messages))
    messages.success(request, f"Removed {username} from {project.name}.")
    if membership.user_id == request.user.pk:  # removed themselves: the project is no longer theirs
        request.session.pop(SESSION_KEY, None)
        return redirect(reverse("dashboard:settings"))
    return redirect(_settings_url(project))


@login_required
@require_POST
def project_create(request):
    """Create a project (the user becomes its owner) and show its first key once."""
    current = current_project(request)  # a ?project= the user is not a member of is a 404 here too
    form = ProjectCreateForm(request.POST)
    if form.is_valid():
        try:
            project, raw = services.project_create(name=form.cleaned_data["name"], owner=request.user)
        except ValidationError as exc:
            _errors_into(form, exc)
        else:
            request.session[SESSION_KEY] = project.pk
            request._tracedash_project = project  # the page (and its top bar) is about the new project now
            key = selectors.api_keys_for_project(project=project).first()
            return _render(request, project, new_key=(key, raw), created_project=project)
    return _render(request, current, status=400, project_form=form)


@login_required
@require_POST
def index_key_add(request):
    """Declare an attribute key for the project's attribute index (what a grouped chart, the Variants
    view or a grouped rule does on first use): it is backfilled within a minute, then read."""
    project = _project_or_404(request)
    form = IndexKeyForm(request.POST)
    if form.is_valid():
        key = form.cleaned_data["key"]
        try:
            added = attribute_index.key_add(project_id=project.pk, key=key)
        except StoreError as exc:
            form.add_error(None, f"ClickHouse did not answer ({exc.__class__.__name__}); nothing was changed.")
        else:
            if not added:
                form.add_error("key", f"This project already indexes {attribute_index.MAX_KEYS} keys, the most it may:"
                                      " remove one first.")
            else:
                messages.success(request, f"Indexing “{key}”: its backfill runs within a minute; until it is done,"
                                          " reads scan the spans.")
                return redirect(f"{_settings_url(project)}#index-keys")
    return _render(request, project, status=400, index_form=form)


@login_required
@require_POST
def index_key_remove(request):
    """Stop indexing a key and delete its index rows (reads grouped by it scan the spans again)."""
    project = _project_or_404(request)
    key = request.POST.get("key", "")
    try:
        removed = attribute_index.key_remove(project_id=project.pk, key=key)
    except StoreError as exc:
        return _render(request, project, status=503,
                       index_error=f"ClickHouse did not answer ({exc.__class__.__name__}); nothing was changed.")
    if not removed:
        return _render(request, project, status=404, index_error=f"“{key}” is not indexed in this project.")
    messages.success(request, f"“{key}” is no longer indexed; reads grouped by it scan the spans.")
    return redirect(f"{_settings_url(project)}#index-keys")
