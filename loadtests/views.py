from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import render

from dashboard.project_scope import current_project

from . import selectors
from .charts import report_figures


@login_required
def load_test_list(request):
    project = current_project(request)
    runs = selectors.load_test_runs_for_project(project_id=project.pk) if project is not None else []
    return render(request, "loadtests/list.html", {"runs": runs})


def _run_or_404(request, pk: int):
    run = selectors.load_test_run_for_user(user=request.user, run_pk=pk)
    if run is None:
        raise Http404("No such load test")
    return run


@login_required
def load_test_detail(request, pk: int):
    run = _run_or_404(request, pk)
    report = run.report
    context = {"run": run, "report": report, "figures": report_figures(report) if report else {}}
    if report:
        context["steps"] = report["steps"]
        context["knee"] = report.get("knee")
        context["burst"] = report.get("burst")
        context["groups"] = report.get("groups") or {}
    return render(request, "loadtests/detail.html", context)


@login_required
def load_test_report_json(request, pk: int):
    run = _run_or_404(request, pk)
    if run.report is None:
        return JsonResponse({"error": {"code": "not_ready", "message": f"load test {run.run_id} is {run.status}; "
                                       "it has no report yet", "details": []}}, status=409)
    return JsonResponse(run.report, json_dumps_params={"indent": 1})
