"""The embedded beat runs the Celery beat schedule in-process: here, the local host sampler."""

import logging
from datetime import datetime, timedelta, timezone

import pytest
from celery import shared_task

from agent.sampler import GpuSample, ResourceSampler
from config import priority
from config.celery import app
from server.embedded_beat import EmbeddedBeat
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

CALLS = []


@shared_task(name="tests.flaky_task")
def flaky_task():
    CALLS.append(1)
    raise RuntimeError("boom")


def test_beat_applies_due_tasks_and_records_local_samples(project_with_key):
    project, _ = project_with_key()
    beat = EmbeddedBeat(app, {"sample": {"task": "agent.tasks.sample_local_host", "schedule": 10.0}})
    start = datetime.now(timezone.utc)
    assert beat.tick(start) <= 10.0
    assert beat.runs == {"sample": 1}
    beat.tick(start + timedelta(seconds=1))  # not due again yet
    assert beat.runs == {"sample": 1}
    rows = get_store().query(
        "SELECT host, gpu_index, cpu_percent, memory_used, memory_total FROM resource_samples WHERE project_id = {p:UInt64}",
        {"p": project.pk}, tag="tests.samples").dicts()
    assert len(rows) == 1
    row = rows[0]
    assert row["gpu_index"] == -1 and row["host"]
    assert 0 <= row["cpu_percent"] <= 100
    assert 0 < row["memory_used"] < row["memory_total"]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_failing_task_is_logged_and_the_schedule_goes_on():
    CALLS.clear()
    collect = _Collect()
    logging.getLogger("tracedash.beat").addHandler(collect)
    beat = EmbeddedBeat(app, {"flaky": {"task": "tests.flaky_task", "schedule": 0.1}})
    now = datetime.now(timezone.utc)
    beat.tick(now)
    beat.last_run["flaky"] = now - timedelta(seconds=1)
    beat.tick(now + timedelta(seconds=1))
    logging.getLogger("tracedash.beat").removeHandler(collect)
    assert len(CALLS) == 2
    failures = [r for r in collect.records if r.getMessage() == "scheduled task flaky (tests.flaky_task) failed"]
    assert len(failures) == 2 and "boom" in str(failures[0].exc_info[1])


SLOW_RUNNING = []
FAST_WHILE_SLOW = []


@shared_task(name="tests.slow_task")
def slow_task():
    import threading

    done = threading.Event()
    SLOW_RUNNING.append(done)
    done.wait(60)  # released by the test once the fast task has run meanwhile


@shared_task(name="tests.fast_task")
def fast_task():
    if SLOW_RUNNING and not SLOW_RUNNING[-1].is_set():
        FAST_WHILE_SLOW.append(1)


def test_an_entry_with_its_own_thread_runs_while_the_others_are_busy():
    from tests.conftest import wait_until

    SLOW_RUNNING.clear()
    FAST_WHILE_SLOW.clear()
    beat = EmbeddedBeat(app, {"slow": {"task": "tests.slow_task", "schedule": 3600.0},
                              "fast": {"task": "tests.fast_task", "schedule": 0.05}}, own_thread=("fast",))
    assert beat.lanes == [["slow"], ["fast"]]
    beat.start()
    try:
        wait_until(lambda: SLOW_RUNNING, message="the slow task started")
        # The shared thread is stuck in the slow task; the summariser-like entry keeps its schedule.
        wait_until(lambda: len(FAST_WHILE_SLOW) >= 3, message="the own-thread task ran while the slow one ran")
    finally:
        beat.request_stop()
        for event in SLOW_RUNNING:
            event.set()
        assert beat.stop(timeout=60)


NICE_SEEN = []


@shared_task(name="tests.nice_task")
def nice_task():
    NICE_SEEN.append(priority.nice_of())


@pytest.mark.skipif(not priority.supported(), reason="a thread has a nice value of its own on Linux only")
@pytest.mark.parametrize("nice", [0, 7])
def test_the_beat_threads_run_at_the_priority_asked_for_and_the_rest_of_the_process_keeps_its_own(nice):
    """TRACEDASH_BACKGROUND_NICE: the beat's threads (each lane's) lower their own CPU priority; the
    thread that started the beat, and so the request threads, keep theirs."""
    from tests.conftest import wait_until

    NICE_SEEN.clear()
    own = priority.nice_of()
    beat = EmbeddedBeat(app, {"shared": {"task": "tests.nice_task", "schedule": 3600.0},
                              "alone": {"task": "tests.nice_task", "schedule": 3600.0}},
                        own_thread=("alone",), nice=nice)
    beat.start()
    try:
        wait_until(lambda: len(NICE_SEEN) == 2, message="both lanes ran their task")
    finally:
        assert beat.stop(timeout=60)
    assert NICE_SEEN == [min(19, own + nice)] * 2
    assert priority.nice_of() == own


def test_unknown_task_in_schedule_fails_at_start():
    beat = EmbeddedBeat(app, {"x": {"task": "no.such.task", "schedule": 1.0}})
    with pytest.raises(RuntimeError, match="no.such.task"):
        beat.start()


class FakeNvml:
    available = True
    reason = ""

    def sample(self):
        return [GpuSample(index=0, uuid="GPU-1", name="Fake H100", utilization=97.0, memory_used=70 * 2**30,
                          memory_total=80 * 2**30, temperature=71.0, power_watts=350.5,
                          processes=[(4242, "python", 60 * 2**30)])]


def test_sampler_rows_include_gpus_with_missing_figures_left_missing():
    rows = ResourceSampler(host="gpu-host-1", nvml=FakeNvml()).sample()
    host, gpu = rows
    assert host["gpu_index"] == -1 and host["gpu_utilization"] is None and host["cpu_percent"] is not None
    assert gpu["gpu_index"] == 0 and gpu["cpu_percent"] is None  # never reported as 0
    assert gpu["gpu_memory_used"] / gpu["gpu_memory_total"] == pytest.approx(0.875)
    assert gpu["process_pids"] == [4242] and gpu["process_gpu_memory"] == [60 * 2**30]
    assert get_store().insert("resource_samples", [{**r, "project_id": 1} for r in rows], tag="tests.samples") == 2


def test_the_local_samples_of_every_project_go_in_one_insert(project_with_key):
    """The embedded sampler records the host for each project of the installation: one insert for
    them all (each insert has a fixed cost), every project with its own rows."""
    from agent.tasks import sample_local_host
    from ingest.writer import get_writer

    first, _ = project_with_key()
    second, _ = project_with_key()
    writer = get_writer()
    inserts = []
    real = type(writer)._store_or_spool

    def counting(self, table_name, token, rows):
        inserts.append((table_name, sorted({int(r["project_id"]) for r in rows})))
        return real(self, table_name, token, rows)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(writer), "_store_or_spool", counting)
        assert sample_local_host() >= 2
    mine = [(t, p) for t, p in inserts if first.pk in p or second.pk in p]
    assert len(mine) == 1 and mine[0][0] == "resource_samples" and {first.pk, second.pk} <= set(mine[0][1])
    for project in (first, second):
        assert get_store().query("SELECT count() FROM resource_samples WHERE project_id = {p:UInt64}",
                                 {"p": project.pk}, tag="tests.samples").scalar() == 1
