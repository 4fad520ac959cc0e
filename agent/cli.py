"""The resource agent: ``python -m agent --endpoint URL --api-key KEY [--interval 5] [--host NAME]
[--scrape [ENGINE=]URL ...] [--once]``.

Samples this host (CPU, memory) and its GPUs (NVML) every interval, sends the samples to
``POST {endpoint}/api/v1/resources``; scrapes the inference engines' Prometheus endpoints it is
pointed at (``--scrape``, vLLM / TGI / SGLang / TensorRT-LLM) in the same tick and sends their samples to
``POST {endpoint}/api/v1/engine_samples``; logs a one-line status periodically, and stops cleanly on
SIGINT/SIGTERM after a final flush. Runs on a GPU host that has only the ``agent/`` folder,
``psutil``, ``nvidia-ml-py`` and ``prometheus_client``: nothing here imports Django or the server.

Settings, the command line winning over the environment:
``--endpoint`` / ``TRACEDASH_ENDPOINT``, ``--api-key`` / ``TRACEDASH_API_KEY``,
``--interval`` / ``TRACEDASH_AGENT_INTERVAL`` (seconds, default 5), ``--host`` /
``TRACEDASH_AGENT_HOST`` (default: this machine's host name), ``--scrape`` (repeatable) /
``TRACEDASH_SCRAPE`` (comma-separated).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time

from .engines import parse_target
from .sampler import MAX_LABEL_CHARS, ResourceSampler
from .scrape import EngineScraper
from .sender import ENGINES_PATH, ResourceSender, resources_url

log = logging.getLogger("tracedash.agent")

DEFAULT_INTERVAL = 5.0
MIN_INTERVAL = 0.1
MAX_INTERVAL = 86_400.0
DEFAULT_STATUS_EVERY = 60.0
ONCE_CPU_WINDOW = 0.5  # --once: the CPU % is measured over this long before the one sample


def _interval(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"expected seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}, got {text!r}")
    return value


def _target(text: str) -> str:
    try:
        parse_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="tracedash resource agent: samples host CPU/memory and GPUs (NVML) and sends them to a tracedash server.")
    parser.add_argument("--endpoint", help="server base URL, e.g. http://tracedash:8000 (env TRACEDASH_ENDPOINT)")
    parser.add_argument("--api-key", help="the project's ingest key (env TRACEDASH_API_KEY; prefer the variable: "
                                          "arguments are visible to every user in the process list)")
    parser.add_argument("--interval", type=_interval, default=None,
                        help=f"seconds between samples (env TRACEDASH_AGENT_INTERVAL; default {DEFAULT_INTERVAL:g})")
    parser.add_argument("--host", help="host name the samples carry (env TRACEDASH_AGENT_HOST; default: this machine's)")
    parser.add_argument("--scrape", action="append", type=_target, default=None, metavar="[ENGINE=]URL",
                        help="an inference engine's Prometheus endpoint to scrape each interval, e.g. "
                             "vllm=http://127.0.0.1:8000/metrics (repeat for several; env TRACEDASH_SCRAPE, "
                             "comma-separated; the engine is recognised from its metric names when not given)")
    parser.add_argument("--scrape-timeout", type=_interval, default=2.0, metavar="SECONDS",
                        help="seconds per scrape (default 2)")
    parser.add_argument("--once", action="store_true",
                        help="take one sample, send it and exit (status 0 when the server took it all)")
    parser.add_argument("--max-buffer", type=_positive_int, default=10_000, metavar="SAMPLES",
                        help="samples kept while the server is unreachable; beyond it the oldest are dropped (default 10000)")
    parser.add_argument("--timeout", type=_interval, default=5.0, help="seconds per HTTP request (default 5)")
    parser.add_argument("--status-every", type=_interval, default=DEFAULT_STATUS_EVERY, metavar="SECONDS",
                        help=f"seconds between status lines in the log (default {DEFAULT_STATUS_EVERY:g})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level when the agent sets up logging itself (default INFO)")
    return parser


def parse_args(argv=None, environ=None) -> argparse.Namespace:
    """Arguments, with the TRACEDASH_* variables filling what the command line leaves out."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    args = parser.parse_args(argv)
    args.endpoint = (args.endpoint or environ.get("TRACEDASH_ENDPOINT") or "").strip()
    args.api_key = (args.api_key or environ.get("TRACEDASH_API_KEY") or "").strip()
    args.host = (args.host or environ.get("TRACEDASH_AGENT_HOST") or "").strip() or None
    if args.interval is None:
        raw = (environ.get("TRACEDASH_AGENT_INTERVAL") or "").strip()
        try:
            args.interval = _interval(raw) if raw else DEFAULT_INTERVAL
        except argparse.ArgumentTypeError as exc:
            parser.error(f"TRACEDASH_AGENT_INTERVAL: {exc}")
    if not args.endpoint:
        parser.error("no server: give --endpoint URL or set TRACEDASH_ENDPOINT (e.g. http://tracedash:8000)")
    if not args.endpoint.startswith(("http://", "https://")):
        parser.error(f"--endpoint/TRACEDASH_ENDPOINT: expected an http:// or https:// URL, got {args.endpoint!r}")
    if not args.api_key:
        parser.error("no ingest key: give --api-key KEY or set TRACEDASH_API_KEY")
    if args.scrape is None:
        raw = environ.get("TRACEDASH_SCRAPE") or ""
        try:
            args.scrape = [_target(part) for part in raw.split(",") if part.strip()]
        except argparse.ArgumentTypeError as exc:
            parser.error(f"TRACEDASH_SCRAPE: {exc}")
    if args.host is not None and len(args.host) > MAX_LABEL_CHARS:
        parser.error(f"--host: at most {MAX_LABEL_CHARS} characters")
    return args


class Agent:
    """The sample-and-send loop, shared by ``python -m agent`` and ``manage.py run_agent``."""

    def __init__(self, sampler: ResourceSampler, sender: ResourceSender, *, interval: float = DEFAULT_INTERVAL,
                 status_every: float = DEFAULT_STATUS_EVERY, clock=time.monotonic,
                 scraper: EngineScraper | None = None, engine_sender: ResourceSender | None = None):
        self.sampler = sampler
        self.sender = sender
        self.scraper = scraper if scraper else None
        self.engine_sender = engine_sender if self.scraper else None
        self.engine_samples = 0
        self.interval = interval
        self.status_every = status_every
        self.clock = clock
        self.samples_taken = 0
        self.gpus = 0

    def sample(self) -> int:
        """Sample once into the sender's buffer; the number of rows (0 if sampling failed)."""
        try:
            rows = self.sampler.sample()
        except Exception:  # noqa: BLE001 - a sampling bug must not end the agent: log it, try again next time
            log.exception("sampling failed")
            rows = []
        if rows:
            self.samples_taken += 1
            self.gpus = sum(1 for row in rows if row.get("gpu_index", -1) >= 0)
            self.sender.add(rows)
        if self.scraper is not None:
            try:
                engine_rows = self.scraper.scrape()
            except Exception:  # noqa: BLE001 - a scraping bug must not end the agent (nor cost the host sample)
                log.exception("scraping failed")
                engine_rows = []
            self.engine_samples += len(engine_rows)
            self.engine_sender.add(engine_rows)
        return len(rows)

    def _senders(self) -> list[ResourceSender]:
        return [self.sender] + ([self.engine_sender] if self.engine_sender is not None else [])

    def flush(self) -> None:
        for sender in self._senders():
            sender.flush()

    def tick(self) -> int:
        """Sample once, then flush (``--once``)."""
        rows = self.sample()
        self.flush()
        return rows

    def status_line(self) -> str:
        stats = self.sender.stats
        line = (f"agent status: host={self.sampler.host} gpus={self.gpus} samples={self.samples_taken} "
                f"sent={stats['sent']} buffered={stats['buffered']} dropped={stats['dropped']} "
                f"failed={stats['failed']} retries={stats['retries']}")
        if stats.get("last_error"):
            line += f" last_error={stats['last_error']!r}"
        if self.engine_sender is not None:
            engine = self.engine_sender.stats
            line += (f" engines=[{self.scraper.status()}] engine_samples={self.engine_samples} "
                     f"engine_sent={engine['sent']} engine_buffered={engine['buffered']}")
            if engine.get("last_error"):
                line += f" engine_last_error={engine['last_error']!r}"
        return line

    def run(self, stop: threading.Event) -> None:
        """Sample every interval until ``stop`` is set, then shut down. Sending runs in a thread of
        its own, so a server that hangs (up to --timeout per request) never delays a sample."""
        wake = threading.Event()
        sending = threading.Thread(target=self._send_loop, args=(stop, wake), name="tracedash-agent-sender", daemon=True)
        sending.start()
        next_tick = next_status = self.clock()
        next_status += self.status_every
        try:
            while not stop.is_set():
                self.sample()
                wake.set()
                now = self.clock()
                if now >= next_status:
                    log.info(self.status_line())
                    next_status = now + self.status_every
                next_tick += self.interval
                if next_tick < now:  # fell behind (a slow sample): skip the missed ticks, no burst
                    next_tick = now + self.interval
                stop.wait(max(0.0, next_tick - self.clock()))
        finally:
            stop.set()
            wake.set()
            sending.join(timeout=self.sender.timeout + 1)  # a request in flight ends within its timeout
        self.shutdown()

    def _send_loop(self, stop: threading.Event, wake: threading.Event) -> None:
        while not stop.is_set():
            wake.wait(timeout=max(self.interval, 1.0))
            wake.clear()
            if stop.is_set():
                return  # the final flush is shutdown()'s
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a sender bug must not end sending: log it, try again
                log.exception("sending failed")

    def shutdown(self, *, flush: bool = True) -> None:
        """Final flush, final status line; NVML is released."""
        for sender in self._senders():
            if flush and sender.buffered:
                sender.flush()
        left = sum(sender.buffered for sender in self._senders())
        if left:
            log.warning("stopping with %d samples unsent (server unreachable); they are lost", left)
        log.info("stopped; %s", self.status_line())
        try:
            self.sampler.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            log.debug("closing the sampler failed", exc_info=True)


def _configure_logging(level: str) -> None:
    """Log to stderr unless the host program (Django, pytest) already set logging up."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=getattr(logging, level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _install_signal_handlers(stop: threading.Event):
    """SIGINT/SIGTERM set ``stop`` (a second one exits at once); returns a function restoring the
    previous handlers. Signals can be handled only in the main thread: elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {}

    def handle(signum, frame):
        if stop.is_set():
            raise SystemExit(128 + signum)
        log.info("%s received: stopping after a final flush", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handle)

    def restore():
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def main(argv=None, *, stop: threading.Event | None = None, environ=None) -> int:
    """Run the agent; returns the exit status (0; 1 when ``--once`` could not deliver everything).
    ``stop`` ends the loop from another thread (tests, an embedding program)."""
    args = parse_args(argv, environ)
    _configure_logging(args.log_level)
    sender = ResourceSender(args.endpoint, args.api_key, max_buffer_samples=args.max_buffer, timeout=args.timeout)
    sampler = ResourceSampler(host=args.host or socket.gethostname(),
                              **({"min_cpu_window": ONCE_CPU_WINDOW} if args.once else {}))
    gpus = len(sampler.nvml.sample()) if sampler.nvml.available else 0
    log.info("tracedash agent: host=%s endpoint=%s interval=%gs GPUs=%s%s", sampler.host, resources_url(args.endpoint),
             args.interval, gpus if sampler.nvml.available else "none (NVML unavailable)", " (once)" if args.once else "")
    scraper = EngineScraper(args.scrape, host=sampler.host, timeout=args.scrape_timeout) if args.scrape else None
    engine_sender = (ResourceSender(args.endpoint, args.api_key, max_buffer_samples=args.max_buffer * 20,
                                    timeout=args.timeout, path=ENGINES_PATH) if scraper else None)
    if scraper:
        log.info("scraping %d inference engine endpoint(s): %s", len(scraper.targets),
                 ", ".join(repr(t) for t in scraper.targets))
    agent = Agent(sampler, sender, interval=args.interval, status_every=args.status_every,
                  scraper=scraper, engine_sender=engine_sender)
    if args.once:
        rows = agent.tick()
        agent.shutdown(flush=False)  # tick() has just flushed
        stats = sender.stats
        engines_delivered = engine_sender is None or not engine_sender.buffered
        return 0 if rows and stats["sent"] == rows and not stats["buffered"] and engines_delivered else 1
    stop = stop or threading.Event()
    restore = _install_signal_handlers(stop)
    try:
        agent.run(stop)
    finally:
        restore()
    return 0


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console_main()
