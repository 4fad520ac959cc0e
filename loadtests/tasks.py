"""Celery task of load tests started from the page (production; the embedded server runs them in
a thread instead, see loadtests.services.load_test_start)."""

from celery import shared_task


@shared_task(name="loadtests.run", acks_late=False)
def load_test_run_task(run_pk: int, trace_endpoint: str | None, target_api_key: str | None = None) -> None:
    # acks_late off: a load test is not safe to run twice (a redelivered message would double the load).
    from .runner import load_test_execute

    load_test_execute(run_pk=run_pk, trace_endpoint=trace_endpoint, target_api_key=target_api_key)
