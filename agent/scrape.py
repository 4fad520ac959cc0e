"""Scrapes inference engines' Prometheus ``/metrics`` endpoints (``--scrape [ENGINE=]URL``) into
engine samples (``agent.engines``), which the agent sends to ``POST /api/v1/engine_samples``.

One GET per target per interval (plain urllib, ``Accept: text/plain``), parsed by
``prometheus_client``; a target that is down, slow or answers something that is not the exposition
format costs one log line when it starts failing and one when it recovers, never the other targets
or the host's own samples.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request

from .engines import parse_exposition, parse_target, samples_rows

log = logging.getLogger("tracedash.agent")

MAX_SCRAPE_BYTES = 32 * 1024 * 1024  # a vLLM server with many LoRA adapters stays far below this
USER_AGENT = "tracedash-agent/1"


class ScrapeError(Exception):
    pass


def fetch_exposition(url: str, *, timeout: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
                                                   "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(MAX_SCRAPE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"HTTP {exc.code} from {url}") from None
    except Exception as exc:  # noqa: BLE001 - URLError, timeout, reset, DNS: the target is down
        reason = getattr(exc, "reason", None) or exc
        raise ScrapeError(f"cannot reach {url}: {type(reason).__name__}: {reason}") from None
    if len(body) > MAX_SCRAPE_BYTES:
        raise ScrapeError(f"{url} answered more than {MAX_SCRAPE_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


class Target:
    def __init__(self, spec: str):
        self.engine, self.url = parse_target(spec)
        self.failing: str | None = None
        self.scrapes = 0
        self.failures = 0
        self.ignored = 0

    def __repr__(self) -> str:
        return f"{self.engine + '=' if self.engine else ''}{self.url}"


class EngineScraper:
    """Scrapes each target once per ``scrape()``; returns the engine samples of all that answered."""

    def __init__(self, targets: list[str], *, host: str, timeout: float = 2.0, clock=time.time_ns):
        self.targets = [Target(spec) for spec in targets]
        self.host = host
        self.timeout = timeout
        self.clock = clock

    def __bool__(self) -> bool:
        return bool(self.targets)

    def scrape(self) -> list[dict]:
        rows: list[dict] = []
        for target in self.targets:
            rows.extend(self._scrape(target))
        return rows

    def _scrape(self, target: Target) -> list[dict]:
        target.scrapes += 1
        now = self.clock()
        try:
            text = fetch_exposition(target.url, timeout=self.timeout)
            try:
                families = parse_exposition(text)
            except ValueError as exc:
                raise ScrapeError(f"{target.url} did not answer the Prometheus text format: {exc}") from None
            rows, ignored = samples_rows(families, time_ns=now, host=self.host, target=target.url, engine=target.engine)
        except ScrapeError as exc:
            target.failures += 1
            if target.failing != str(exc):
                log.warning("scraping %r failed: %s (logged again when it changes or recovers)", target, exc)
                target.failing = str(exc)
            return []
        target.ignored = ignored
        if target.failing is not None:
            log.info("scraping %r works again", target)
            target.failing = None
        if not rows and target.scrapes == 1:
            log.warning("%r serves no metric tracedash knows (%d samples ignored): is it a vLLM, TGI, SGLang or "
                        "TensorRT-LLM /metrics?", target, ignored)
        return rows

    def status(self) -> str:
        return " ".join(f"{t!r}:{'down' if t.failing else 'ok'}" for t in self.targets)
