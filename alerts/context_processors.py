from projects.scope import current_project

from .selectors import alerts_firing_payload


def pages(alert: dict) -> bool:
    """Whether a firing alert belongs in the banner: not silenced, and not an ``info`` rule
    (informational rules show on the alerts page only)."""
    return not alert["silenced"] and alert["severity"] != "info"


def firing_alerts(request):
    """Every page renders the firing-alerts banner server-side (the socket keeps it live)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    project = current_project(request)
    if project is None:
        return {"alerts_firing": []}
    firing = [a for a in alerts_firing_payload(project_id=project.pk) if pages(a)]
    return {"alerts_firing": firing}
