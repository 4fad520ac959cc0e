"""Which project a page request is about (dashboard, alerts, load tests, settings): ``?project=<id>``
(remembered in the session), else the one chosen before, else the user's first. Only projects the
user is a member of."""

from __future__ import annotations

from django.http import Http404

from .selectors import project_for_user, projects_for_user

SESSION_KEY = "tracedash_project_id"


def current_project(request):
    cached = getattr(request, "_tracedash_project", None)
    if cached is not None:
        return cached
    user = request.user
    requested = request.GET.get("project")
    if requested is not None:
        project = project_for_user(user=user, project_id=requested)
        if project is None:
            raise Http404("No such project")
        request.session[SESSION_KEY] = project.pk
    else:
        project = project_for_user(user=user, project_id=request.session.get(SESSION_KEY))
        if project is None:
            project = projects_for_user(user=user).first()
    request._tracedash_project = project
    return project
