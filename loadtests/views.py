from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from projects.scope import current_project
from dashboard.views import json_login_required

from . import selectors
from .charts import report_figures
from .forms import LoadTestStartForm
from .services import LoadTestBusy, load_test_run_expire_if_stale, load_test_start


def _list_page(request, form, status=200):
    project = current_project(request)
    runs = selectors.load_test_runs_for_project(project_id=project.pk) if project is not None else []
    return render(request, "loadtests/list.html", {"runs": runs, "form": form}, status=status)


@login_required
def load_test_list(request):
    return _list_page(request, LoadTestStartForm())


@login_required
@require_POST
def load_test_start_view(request):
    project = current_project(request)
    if project is None:
        raise Http404("No project")
    form = LoadTestStartForm(request.POST)
    if not form.is_valid():
        return _list_page(request, form, status=400)
    try:
        run = load_test_start(project=project, options=form.cleaned_data,
                              trace_endpoint=f"{request.scheme}://{request.get_host()}")
    except LoadTestBusy as exc:
        form.add_error(None, str(exc))
        return _list_page(request, form, status=409)
    return redirect(reverse("loadtests:detail", args=[run.pk]) + f"?project={project.pk}")


def _run_or_404(request, pk: int):
    run = selectors.load_test_run_for_user(user=request.user, run_pk=pk)
    if run is None:
        raise Http404("No such load test")
    return run


def traces_url(run) -> str:
    """The trace explorer filtered to the run's requests (attribute ``loadtest.run_id``), over the
    run's time (to now while it runs)."""
    params = {"project": run.project_id, "attr": f"loadtest.run_id={run.run_id}",
              "from": (run.created_at - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if run.finished_at is not None:
        params["to"] = (run.finished_at + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return reverse("dashboard:traces") + "?" + urlencode(params)


@login_required
def load_test_detail(request, pk: int):
    run = _run_or_404(request, pk)
    report = run.report
    context = {"run": run, "report": report, "figures": report_figures(report) if report else {},
               "traces_url": traces_url(run)}
    if report:
        context["steps"] = report["steps"]
        context["knee"] = report.get("knee")
        context["burst"] = report.get("burst")
        context["groups"] = report.get("groups") or {}
    return render(request, "loadtests/detail.html", context)


@json_login_required
def load_test_progress(request, pk: int):
    """A run's status and live counters, polled by the run's page while it runs."""
    run = _run_or_404(request, pk)
    load_test_run_expire_if_stale(run=run)  # its server stopped under it: say so, do not keep the page polling
    return JsonResponse({"run_id": run.run_id, "status": run.status, "progress": run.progress or {},
                         "error": run.error, "finished": run.status != run.Status.RUNNING})


@login_required
def load_test_report_json(request, pk: int):
    run = _run_or_404(request, pk)
    if run.report is None:
        return JsonResponse({"error": {"code": "not_ready", "message": f"load test {run.run_id} is {run.status}; "
                                       "it has no report yet", "details": []}}, status=409)
    return JsonResponse(run.report, json_dumps_params={"indent": 1})
