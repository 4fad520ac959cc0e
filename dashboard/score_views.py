"""The trace page's scores: the list (``score_rows``, shown by the page and returned as JSON) and
the review form's endpoint (``POST /traces/<id>/scores/``): a logged-in member marks the trace good
or bad (boolean ``review.good``) or rates it 1 to 5 (numeric ``review.rating``), with an optional
comment. The score is written through the ingest service the API uses (``ingest.services``), with
source ``annotation`` and author the user's username: its id is derived from (trace, name, source,
author), so a reviewer's second verdict or rating replaces their first."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from analytics.scores import trace_scores
from ingest.services import scores_ingest
from ingest.spool import SpoolFull
from ingest.writer import Overloaded
from projects.selectors import project_for_user
from store import StoreError

from . import trace_detail

log = logging.getLogger("tracedash.dashboard")

REVIEW_GOOD = "review.good"
REVIEW_RATING = "review.rating"
MAX_REVIEW_COMMENT = 2000


def _value_text(score: dict) -> str:
    value = score["value"]
    if score["data_type"] == "boolean":
        return "true" if value else "false"
    if score["data_type"] == "numeric":
        return f"{value:g}"
    return str(value)


def score_rows(scores: list[dict]) -> list[dict]:
    """Scores as the trace page lists them (the template escapes every field; the page's script
    sets them as text)."""
    return [{"name": s["name"], "value": _value_text(s), "data_type": s["data_type"], "source": s["source"],
             "author": s["author"], "comment": s["comment"], "span_id": s["span_id"],
             "time": datetime.fromtimestamp(s["time_ms"] / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
            for s in scores]


def _error(status: int, field: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": "invalid_review" if status == 400 else "unavailable", "message": message,
                                   "details": [{"field": field, "message": message}] if field else []}}, status=status)


def _review_score(post) -> tuple[dict | None, JsonResponse | None]:
    comment = (post.get("comment") or "").strip()
    if len(comment) > MAX_REVIEW_COMMENT:
        return None, _error(400, "comment", f"a comment is at most {MAX_REVIEW_COMMENT} characters")
    verdict, rating = post.get("verdict"), post.get("rating")
    if verdict and rating:
        return None, _error(400, "verdict", "send either a verdict (good/bad) or a rating, not both")
    if verdict:
        if verdict not in ("good", "bad"):
            return None, _error(400, "verdict", "verdict must be good or bad")
        return {"name": REVIEW_GOOD, "value": verdict == "good", "comment": comment}, None
    if rating:
        if rating not in ("1", "2", "3", "4", "5"):
            return None, _error(400, "rating", "rating must be a whole number from 1 to 5")
        return {"name": REVIEW_RATING, "value": int(rating), "comment": comment}, None
    return None, _error(400, "verdict", "choose Good or Bad, or a rating from 1 to 5")


@login_required
@require_POST
def trace_review(request, trace_id: str):
    """``POST /traces/<id>/scores/?project=<id>`` (session and CSRF): the review form. Answers the
    trace's scores as JSON to the page's script (``Accept: application/json``), else redirects
    back to the trace page."""
    trace_id = trace_id.lower()
    project = project_for_user(user=request.user, project_id=request.GET.get("project") or request.POST.get("project"))
    if project is None:
        raise Http404("No such project among yours")
    if not trace_detail.trace_id_valid(trace_id):
        raise Http404("No such trace")
    wants_json = "application/json" in request.headers.get("Accept", "")
    score, problem = _review_score(request.POST)
    if problem is not None:
        return problem
    try:
        if trace_detail.trace_get(project_id=project.pk, trace_id=trace_id) is None:
            raise Http404("No such trace in this project")
        _, rejected = scores_ingest(project_id=project.pk, default_source="annotation", scores=[{
            **score, "trace_id": trace_id, "source": "annotation", "author": request.user.get_username()}])
        if rejected:  # a username longer than a score's author field, say
            return _error(400, rejected[0]["field"], rejected[0]["message"])
        scores = trace_scores(project_id=project.pk, trace_id=trace_id)
    except (StoreError, Overloaded, SpoolFull) as exc:
        log.error("trace review failed: %s", exc)
        return _error(503, "", "the trace store could not take the score; retry later")
    if wants_json:
        return JsonResponse({"scores": score_rows(scores)})
    return redirect(reverse("dashboard:trace", args=[trace_id]) + f"?project={project.pk}#trace-scores")
