"""Helpers shared by the benchmarks: a `manage.py serve` subprocess on embedded defaults, the
machine's description, percentiles and small formatting helpers."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Unset so that the server runs on the embedded defaults (chdb, SQLite, in-process beat and layer).
PRODUCTION_VARIABLES = ("DATABASE_URL", "CELERY_BROKER_URL", "TRACEDASH_CHANNEL_LAYER_URL", "TRACEDASH_CLICKHOUSE_URL",
                        "DJANGO_SETTINGS_MODULE", "TRACEDASH_SECRET_KEY")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(path: Path) -> tuple[str, int, int]:
    """(name, parent pid, CPU ticks: user + system) from a ``/proc/<pid>/stat`` or
    ``/proc/<pid>/task/<tid>/stat`` file; OSError when the process or thread has ended."""
    text = path.read_text()
    fields = text[text.rindex(")") + 2:].split()
    return text[text.index("(") + 1:text.rindex(")")], int(fields[1]), int(fields[11]) + int(fields[12])


def rss_parts(pid: int | str = "self") -> dict[str, int]:
    """A process's resident memory (/proc/<pid>/status; this process by default), bytes: ``total``
    (``VmRSS``), of which ``anon`` (heaps, arenas, anonymous maps: where a leak shows) and ``file``
    (pages of mapped files: the program's and its libraries' code and read-only data, paged in as
    code runs for the first time, reclaimable)."""
    text = Path(f"/proc/{pid}/status").read_text()
    out = {}
    for kind, key in (("total", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile")):
        match = re.search(rf"{key}:\s+(\d+) kB", text)
        out[kind] = int(match.group(1)) * 1024 if match else 0
    return out


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident memory (``VmRSS``; this process by default), bytes."""
    return rss_parts(pid)["total"]


# The server's threads by what they do: our own carry their Python names in the kernel
# (config.priority.name_thread; "td-" for "tracedash-"), the main thread (its id is the process's)
# runs the event loop, ClickHouse names its own; other Python threads keep the process's name.
THREAD_GROUPS = ("request thread (event loop: receive, parse, answer)", "writers", "inserter", "the beat's threads",
                 "ClickHouse merges", "ClickHouse queries and the rest", "other Python threads")


def thread_group(tid: int, pid: int, name: str, process_name: str) -> str:
    if tid == pid:
        return THREAD_GROUPS[0]
    if name.startswith("td-writer"):
        return THREAD_GROUPS[1]
    if name.startswith("td-inserter"):
        return THREAD_GROUPS[2]
    if name.startswith("td-beat"):
        return THREAD_GROUPS[3]
    if name.startswith("MergeMutate"):
        return THREAD_GROUPS[4]
    if name == process_name or name.startswith("td-"):
        return THREAD_GROUPS[6]
    return THREAD_GROUPS[5]


class ThreadCpu:
    """The CPU seconds of each process's threads by ``thread_group``, read from /proc/<pid>/task
    every ``every`` seconds in a thread of this one (Linux; nothing elsewhere) until ``stop()``:
    ``{label: {group: seconds}}``. A thread that starts and ends between two reads is missed, and
    so are the processes a server starts (``--parse-processes``; ``Server.cpu_seconds`` counts them)."""

    def __init__(self, pids: dict[str, int], every: float = 0.5):
        import threading

        self.pids = pids
        self.seconds: dict[str, dict[str, float]] = {label: dict.fromkeys(THREAD_GROUPS, 0.0) for label in pids}
        # ClickHouse's threads outside the merges, by their own names (``QueryCompPipeEx``: the
        # pipelines of INSERT statements, an INSERT … SELECT's reads and materialized views
        # included; ``ThreadPool``: the reads' parallel streams; ``BgSchPool``: the tables'
        # background tasks, ...): {label: {name: seconds}}
        self.clickhouse: dict[str, dict[str, float]] = {label: {} for label in pids}
        self._last: dict[tuple[int, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), name="bench-thread-cpu", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for label, pid in self.pids.items():
            try:
                process_name = Path(f"/proc/{pid}/comm").read_text().strip()
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in map(int, tids):
                try:
                    name, _, ticks = _proc_stat(Path(f"/proc/{pid}/task/{tid}/stat"))
                except OSError:
                    continue  # ended meanwhile
                cpu, key = ticks / _CLOCK_TICKS, (pid, tid)
                group, used = thread_group(tid, pid, name, process_name), cpu - self._last.get(key, cpu)
                self.seconds[label][group] += used
                if group == THREAD_GROUPS[5]:
                    self.clickhouse[label][name] = self.clickhouse[label].get(name, 0.0) + used
                self._last[key] = cpu

    def _run(self, every: float) -> None:
        if not Path("/proc/self/task").is_dir():
            return
        while not self._stop.wait(every):
            self._read()

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        self._thread.join()
        self._read()
        return self.seconds


def process_cpu_seconds() -> float:
    """CPU time (user + system) of this process, every thread included: with the embedded store,
    chdb's ClickHouse threads run inside it."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_by_store_call(store):
    """Count the process's CPU seconds of every store call on ``store``'s backend by the call's tag
    (an insert's line is ``insert <tag>`` and includes its statement's). Returns the live dict and
    ``timed(name, fn, *args)``, which counts a caller's own part the same way."""
    import collections

    cpu: dict[str, float] = collections.defaultdict(float)
    backend = store.backend
    real_run, real_insert = backend._run, backend.insert

    def timed(name, fn, *a, **k):
        started = process_cpu_seconds()
        try:
            return fn(*a, **k)
        finally:
            cpu[name] += process_cpu_seconds() - started

    backend._run = lambda sql, params, fmt, tag: timed(tag, real_run, sql, params, fmt, tag)
    backend.insert = lambda table_, columns, types, rows, tag, *a, **k: timed(
        f"insert {tag}", real_insert, table_, columns, types, rows, tag, *a, **k)
    return cpu, timed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the production variables, on ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
    # No demo workload: benchmarks count every span they send and nothing else.
    env.update(TRACEDASH_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", TRACEDASH_DEMO="0", **extra)
    return env


class Server:
    """``manage.py serve`` as a subprocess on its own data dir; output goes to a log file."""

    def __init__(self, data_dir: Path, *, port: int | None = None, env: dict[str, str] | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = embedded_env(self.data_dir, **(env or {}))
        self.log_path = self.data_dir.parent / f"serve-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 120.0) -> "Server":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited early with code {self.proc.returncode}")
            try:
                self.health()
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                time.sleep(0.2)
        raise RuntimeError(f"serve did not answer /healthz within {timeout:.0f} s")

    def health(self) -> dict:
        """The /healthz body (its 503 body too: the checks say what is wrong)."""
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return json.load(exc)
            raise

    def manage(self, *args: str, timeout: float = 120.0) -> str:
        """Run a management command with the server's environment; its stdout."""
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    def _family(self) -> dict[int, int]:
        """{pid: CPU ticks} of the server's process and the processes it started that still run
        (the ingest parse workers, TRACEDASH_INGEST_PARSE_PROCESSES)."""
        stats = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    _, parent, ticks = _proc_stat(entry / "stat")
                except OSError:
                    continue  # ended meanwhile
                stats[int(entry.name)] = (parent, ticks)
        found, family = {}, {self.proc.pid}
        while family:
            pid = family.pop()
            found[pid] = stats.get(pid, (0, 0))[1]
            family |= {child for child, (parent, _) in stats.items() if parent == pid and child not in found}
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far: its process (all its threads) and the
        processes it started that still run."""
        return sum(self._family().values()) / _CLOCK_TICKS

    def pause(self) -> None:
        """Freeze the server and its workers (SIGSTOP): they use no CPU until ``resume``. Two
        servers measured by turns on one machine (bench/ingest.py --compare-beat) each do their
        own work, the beat's included, only in their own turns."""
        self._signal_family(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_family(signal.SIGCONT)

    def _signal_family(self, sig) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in self._family():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ctrl-C (SIGINT), then SIGKILL if it does not stop in time; the exit code."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                self.resume()  # a paused server cannot act on SIGINT
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=30)
            return self.proc.returncode
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def machine() -> dict:
    """What the numbers were measured on."""
    info = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if match:
            info["cpu_model"] = match.group(1).strip()
    except OSError:
        pass
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        info["cgroup_cpu_limit"] = "none" if quota == "max" else f"{int(quota) / int(period):g} CPUs"
    except (OSError, ValueError):
        pass
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if match:
            info["memory_gib"] = round(int(match.group(1)) / 2**20, 1)
    except OSError:
        pass
    return info


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = math.ceil(q / 100.0 * len(sorted_values))
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)])
