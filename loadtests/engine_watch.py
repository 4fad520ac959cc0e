"""While a load test drives the built-in simulator, its vLLM-style ``/metrics`` is scraped every
second: the samples go to the server like an agent's (``POST /api/v1/engine_samples`` with the
run's key, so the Engines page shows the run), and a timeline of the engine's queue and KV cache is
kept for the report, whose chart puts it on one time axis with the requests' TTFT — the knee seen
from inside the engine (KV cache full, requests waiting) at the moment the clients feel it."""

from __future__ import annotations

import socket
import threading
from datetime import datetime

from agent.scrape import EngineScraper
from agent.sender import ENGINES_PATH, ResourceSender

INTERVAL_S = 1.0
_GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")


class EngineWatch:
    """``start()`` before the test, ``stop()`` after it; ``timeline(started_at)`` for the report."""

    def __init__(self, metrics_url: str, *, endpoint: str | None = None, api_key: str | None = None,
                 engine: str = "vllm", interval: float = INTERVAL_S):
        self.scraper = EngineScraper([f"{engine}={metrics_url}"], host=socket.gethostname())
        self.sender = (ResourceSender(endpoint, api_key, max_buffer_samples=200_000, path=ENGINES_PATH)
                       if endpoint and api_key else None)
        self.interval = interval
        self._points: list[dict] = []  # per scrape: unix seconds, gauges summed over models, preemptions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadtest-engine-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + 10)
        self._scrape_once()  # the state at the end
        if self.sender is not None:
            self.sender.flush()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scrape_once()
            if self.sender is not None:
                self.sender.flush()
            self._stop.wait(self.interval)

    def _scrape_once(self) -> None:
        rows = self.scraper.scrape()
        if not rows:
            return
        point = {"time_s": rows[0]["time"] / 1e9, "preemptions": 0.0}
        for row in rows:
            metric = row["metric"]
            if metric in _GAUGES:
                point[metric] = point.get(metric, 0.0) + row["value"]
            elif metric == "preemptions":
                point["preemptions"] += row["value"]
        if "kv_cache_usage" in point:  # several models' pools: the fullest one is what requests wait for
            point["kv_cache_usage"] = max(r["value"] for r in rows if r["metric"] == "kv_cache_usage")
        self._points.append(point)
        if self.sender is not None:
            self.sender.add(rows)

    def timeline(self, started_at: str) -> list[dict]:
        """Per scrape, seconds from the test's start (the report's ``started_at``): running, waiting,
        KV-cache usage %, and preemptions since the test began."""
        start = datetime.fromisoformat(started_at).timestamp()
        first = self._points[0]["preemptions"] if self._points else 0.0
        return [{"t": round(p["time_s"] - start, 3),
                 "running": p.get("requests_running"), "waiting": p.get("requests_waiting"),
                 "kv_cache_percent": None if p.get("kv_cache_usage") is None else round(p["kv_cache_usage"], 2),
                 "preemptions": p["preemptions"] - first}
                for p in self._points if p["time_s"] >= start - self.interval]


def metrics_url(simulator_base_url: str) -> str:
    """The simulator's ``/metrics`` from the base URL load tests target (``http://host:port/v1``)."""
    base = simulator_base_url.rstrip("/")
    return (base[: -len("/v1")] if base.endswith("/v1") else base) + "/metrics"


def watch_report(watch: EngineWatch | None, report: dict) -> dict:
    """The report with the engine's timeline (``report["engine"]``) when a watch ran."""
    if watch is not None and report.get("started_at"):
        report["engine"] = {"target": watch.scraper.targets[0].url, "timeline": watch.timeline(report["started_at"])}
    return report


__all__ = ["EngineWatch", "metrics_url", "watch_report"]
