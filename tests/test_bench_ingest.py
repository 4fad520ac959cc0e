"""bench/ingest.py --compare-beat's arithmetic and its turns: loads summed over turns, the ratio of
each pair of turns, and a server frozen between its turns (a real process, SIGSTOP / SIGCONT)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common import Server
from bench.ingest import Load, Scenario, ratios, ratios_text


def _scenario(name: str, batch: int) -> Scenario:
    return Scenario(name=name, path="/api/v1/traces", content_type="application/json", batch=batch,
                    templates=[b"x" * 1000], patch=None, check=None)


def _load(name: str, batch: int, turns: list[tuple[int, float]]) -> Load:
    """A load whose turns acknowledged ``spans`` in ``wall`` seconds each."""
    load = Load(_scenario(name, batch))
    for spans, wall in turns:
        load.spans += spans
        load.requests += spans // batch
        load.wall += wall
        load.latencies += [0.1] * (spans // batch)
        load.per_turn.append(spans / wall)
    return load


def test_a_load_over_turns_is_the_sum_of_its_turns():
    result = _load("json-1000", 1000, [(300_000, 10.0), (100_000, 10.0)]).result()
    assert result["spans_per_s"] == 20_000.0  # 400,000 spans in 20 s, not the mean of the turns' rates by chance
    assert result["spans_per_s_by_turn"] == [30_000.0, 10_000.0]
    assert result["turns"] == 2 and result["seconds"] == 20.0


def test_ratios_by_turn_pair_and_their_summary():
    beat = _load("json-1000", 1000, [(270_000, 10.0), (360_000, 10.0), (200_000, 10.0)])
    no_beat = _load("json-1000", 1000, [(300_000, 10.0), (400_000, 10.0), (250_000, 10.0)])
    runs = {True: ([beat.result()], {}), False: ([no_beat.result()], {})}
    figures = ratios(runs, {"raw_rows_per_s_1000": 30_000})
    assert figures["json1000_beat_to_no_beat"] == round(830 / 950, 3)
    assert figures["json1000_beat_to_no_beat_by_turn"] == [0.9, 0.9, 0.8]
    assert figures["json1000_beat_to_raw"] == round(830_000 / 30 / 30_000, 3)
    text = ratios_text(runs, {"raw_rows_per_s_1000": 30_000})
    assert "each pair of turns" in text and "0.80–0.90, median 0.90, 2 of 3 >= 0.9" in text


def test_one_turn_gives_no_pair_line():
    runs = {beat: ([_load("json-1000", 1000, [(300_000, 10.0)]).result()], {}) for beat in (True, False)}
    figures = ratios(runs, {})
    assert figures == {"json1000_beat_to_no_beat": 1.0}
    assert "each pair" not in ratios_text(runs, {})


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_paused_server_and_its_children_use_no_cpu_until_resumed(tmp_path):
    """Server.pause freezes the process and what it started (the parse workers); stop() of a
    paused server still ends it."""
    busy = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']); \nwhile True: pass"
    server = Server(tmp_path / "data")
    server.proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 60
        while len(server._family()) < 2:  # the child has started
            assert time.monotonic() < deadline, "the busy child did not start"
            time.sleep(0.05)
        family = list(server._family())
        server.pause()
        deadline = time.monotonic() + 60
        while any(_state(pid) != "T" for pid in family):
            assert time.monotonic() < deadline, {pid: _state(pid) for pid in family}
            time.sleep(0.05)
        frozen = {pid: _cpu_ticks(pid) for pid in family}
        time.sleep(0.5)
        assert {pid: _cpu_ticks(pid) for pid in family} == frozen
        server.resume()
        deadline = time.monotonic() + 60
        while {pid: _cpu_ticks(pid) for pid in family} == frozen:
            assert time.monotonic() < deadline, "the server did not run again after resume()"
            time.sleep(0.05)
        server.pause()
    finally:
        children = [pid for pid in server._family() if pid != server.proc.pid]
        server.stop(timeout=30)  # resumes it first: a frozen process would not act on SIGINT
        for pid in children:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    assert server.proc.returncode is not None


def _comm(pid: int, tid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' own names and CPU: /proc")
def test_the_cpu_split_by_thread_finds_a_named_threads_work():
    """A real process: a thread named as the server names its beat (config.priority.name_thread) and
    one named as ClickHouse names its INSERT pipelines burn CPU while the main thread sleeps; the
    split puts the first's CPU in the beat's group and the second's in ClickHouse's (under its own
    name too), not the request thread's, and per 1,000 spans in the printed tables."""
    from bench.common import THREAD_GROUPS, ThreadCpu
    from bench.ingest import cpu_split_text

    root = Path(__file__).resolve().parent.parent
    # Each thread names itself, then burns only once told to: by then the split has seen it (a thread's
    # CPU before its first reading is not counted, and on a busy machine readings come late).
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, threading, time; sys.path.insert(0, %r)\n"
        "from config import priority\n"
        "go = threading.Event()\n"
        "def burn(name):\n"
        "    assert priority.name_thread(name)\n"
        "    go.wait()\n"
        "    end = time.thread_time() + 1.5\n"
        "    while time.thread_time() < end: sum(range(1000))\n"
        "threads = [threading.Thread(target=burn, args=(n,), name='tracedash-beat') for n in (None, 'QueryCompPipeEx')]\n"
        "[t.start() for t in threads]; sys.stdin.readline(); go.set()\n"
        "[t.join() for t in threads]; time.sleep(30)\n") % str(root)],
        stdin=subprocess.PIPE, text=True)
    try:
        split = ThreadCpu({"beat": child.pid}, every=0.1)
        deadline = time.monotonic() + 60
        while not {"td-beat", "QueryCompPipeEx"} <= {_comm(pid, tid) for pid, tid in list(split._last) if pid == child.pid}:
            assert time.monotonic() < deadline, "the named threads were not seen"
            time.sleep(0.05)
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        while (min(split.seconds["beat"][THREAD_GROUPS[3]], split.seconds["beat"][THREAD_GROUPS[5]]) < 1.4
               and time.monotonic() < deadline):
            time.sleep(0.2)
        seconds = split.stop()["beat"]
    finally:
        child.kill()
        child.wait()
    # "the beat's threads": found by the kernel name "td-beat" the thread gave itself; ClickHouse's by its own
    assert seconds[THREAD_GROUPS[3]] >= 1.4, seconds
    assert seconds[THREAD_GROUPS[5]] >= 1.4, seconds
    assert split.clickhouse["beat"].get("QueryCompPipeEx", 0.0) >= 1.4, split.clickhouse
    assert seconds[THREAD_GROUPS[0]] < 0.5, seconds  # the main thread slept
    runs = {True: ([{"spans_acknowledged": 1000}], {}), False: ([{"spans_acknowledged": 1000}], {})}
    text = cpu_split_text({"beat": seconds, "no beat": dict.fromkeys(THREAD_GROUPS, 0.0)}, runs,
                          names={"beat": split.clickhouse["beat"], "no beat": {}})
    assert "the beat's threads" in text and f"{seconds[THREAD_GROUPS[3]] * 1000:.2f}" in text
    pipelines = next(line for line in text.splitlines() if "QueryCompPipeEx" in line and "|" in line)
    assert f"{split.clickhouse['beat']['QueryCompPipeEx'] * 1000:.2f}" in pipelines, text


def test_json_bodies_carry_the_time_they_are_sent_at(monkeypatch):
    """Each native JSON request's traces started 20-30 s before it is sent, every time of a body
    moved by the same amount (starts, ends, events), whichever slot the template was built in; the
    bodies of ``--past-starts`` keep the times they were built with."""
    import json

    from bench import ingest

    scenarios = {s.name: s for s in ingest.build_scenarios(3, pool_100=3, pool_1000=2)}
    built = time.time_ns()
    for name in ("json-100", "json-1000"):
        scenario = scenarios[name]
        for template in scenario.templates:
            before = json.loads(ingest.patch_ids(template, 9))["spans"]
            for later_s in (0, 10, 25, 3600):  # the same slot, the next, two on, an hour on
                monkeypatch.setattr(ingest.time, "time_ns", lambda: built + later_s * 10**9)
                after = json.loads(scenario.patch(template, 9))["spans"]
                now = built + later_s * 10**9
                roots = [s for s in after if not s.get("parent_span_id")]
                assert all(20e9 <= now - r["start_time"] <= 31e9 for r in roots), name
                assert max(s["end_time"] for s in after) <= now, "every time in the past"
                shifts = {a[k] - b[k] for a, b in zip(after, before) for k in ("start_time", "end_time")}
                shifts |= {ea["time"] - eb["time"] for a, b in zip(after, before)
                           for ea, eb in zip(a.get("events", []), b.get("events", []))}
                assert len(shifts) == 1, "the body's times all move together"
                assert [a["span_id"] for a in after] == [b["span_id"] for b in before]
            monkeypatch.undo()
    past = {s.name: s for s in ingest.build_scenarios(3, pool_100=1, pool_1000=1, past_starts=True)}["json-1000"]
    assert past.patch(past.templates[0], 4) == ingest.patch_ids(past.templates[0], 4)
    starts = [s["start_time"] for s in json.loads(past.patch(past.templates[0], 4))["spans"]]
    assert max(starts) < time.time_ns() - 100e9, "2-60 minutes before the run"
