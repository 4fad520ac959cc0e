"""The Celery app. Periodic work is declared once, in ``settings.CELERY_BEAT_SCHEDULE``: a real
``celery beat`` runs it in production, ``server.embedded_beat`` in the embedded mode."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tracedash")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
