"""TRACEDASH_BACKGROUND_NICE: the embedded store's merges (and the in-process beat's threads,
tests/test_beat.py) run at a lower CPU priority than the requests; 0 leaves them at the process's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import priority

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not priority.supported(), reason="a thread has a nice value of its own on Linux only")

# Opens the embedded store on its own data directory (chdb: one per process), creates a MergeTree
# table (the engine starts its merge threads then), and reports every thread's name and nice value
# once a later statement has looked for the merge threads.
PROBE = """
import json, os, time, django
django.setup()
from store import get_store, backends
from config import priority
store = get_store()
store.command("CREATE TABLE IF NOT EXISTS probe (a UInt64) ENGINE = MergeTree ORDER BY a", tag="tests.priority")
deadline = time.monotonic() + 60
while not backends._MERGES_LOWERED and time.monotonic() < deadline:
    store.query("SELECT 1", tag="tests.priority")
    time.sleep(0.1)
for n in range(12):  # parts to merge: the merge threads work
    store.command(f"INSERT INTO probe SELECT number FROM numbers({n * 1000}, 1000)", tag="tests.priority")
store.command("OPTIMIZE TABLE probe FINAL", tag="tests.priority")
threads = {}
for tid in os.listdir("/proc/self/task"):
    try:
        threads[tid] = [open(f"/proc/self/task/{tid}/comm").read().strip(), priority.nice_of(int(tid))]
    except OSError:
        pass
print(json.dumps({"me": priority.nice_of(), "lowered": backends._MERGES_LOWERED, "threads": threads,
                  "parts": int(store.query("SELECT count() FROM system.parts WHERE active AND table = 'probe'"
                                           " AND database = currentDatabase()", tag="tests.priority").scalar())}))
"""


def _probe(tmp_path: Path, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRACEDASH_CLICKHOUSE_URL", "TRACEDASH_BACKGROUND_NICE")}
    environ.update(env, DJANGO_SETTINGS_MODULE="config.settings", TRACEDASH_DATA_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_embedded_stores_merges_run_at_a_lower_priority_and_nothing_else_does(tmp_path):
    seen = _probe(tmp_path)
    merges = {int(tid) for tid, (name, _) in seen["threads"].items() if name == "MergeMutate"}
    assert merges and set(seen["lowered"]) == merges
    expected = min(19, seen["me"] + 10)  # the default: 10
    for tid, (name, nice) in seen["threads"].items():
        # the merge threads lowered; no other thread (the caller, ClickHouse's query pool) made nicer
        # (ClickHouse raises its memory worker's priority itself where it may: a lower value)
        if int(tid) in merges:
            assert nice == expected, (name, nice)
        else:
            assert nice <= seen["me"], (name, nice)
    assert seen["parts"] == 1  # the merge ran, at its priority


def test_background_nice_0_leaves_the_merges_at_the_process_priority(tmp_path):
    seen = _probe(tmp_path / "zero", TRACEDASH_BACKGROUND_NICE="0")
    assert seen["lowered"] == []
    merges = [nice for name, nice in seen["threads"].values() if name == "MergeMutate"]
    assert merges and set(merges) == {seen["me"]}
    assert max(nice for _, nice in seen["threads"].values()) == seen["me"]
    assert seen["parts"] == 1


def test_a_nice_value_out_of_range_is_refused(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "TRACEDASH_CLICKHOUSE_URL"}
    environ.update(DJANGO_SETTINGS_MODULE="config.settings", TRACEDASH_DATA_DIR=str(tmp_path),
                   TRACEDASH_BACKGROUND_NICE="20")
    out = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=environ, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "TRACEDASH_BACKGROUND_NICE" in out.stderr
