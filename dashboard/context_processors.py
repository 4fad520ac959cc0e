from projects.scope import current_project as _current_project
from projects.selectors import projects_for_user


def current_project(request):
    """Templates get the user's projects and the one the page is about."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"projects": list(projects_for_user(user=user)), "project": _current_project(request)}
