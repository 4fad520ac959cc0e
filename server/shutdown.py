"""The serving process's orderly stop (``manage.py serve``).

Ctrl-C (SIGINT) or SIGTERM stops in this order, every time:

1. the demo workload stops and its SDK exporter sends its last spans, while the server still serves;
2. the server stops accepting, and answers the requests it has (each after its rows are stored);
3. the ingest writer writes what is queued, the replayer stops between spool segments;
4. the in-process beat starts no new task and the running one finishes;
5. the embedded ClickHouse (chdb) is closed once, after the last call into it has returned;
6. "tracedash: stopped." is printed and the process ends. With the embedded store it ends with
   ``os._exit`` once all of the above is done: chdb's C++ background threads (merges) are still
   alive then, and the interpreter's normal teardown destroying chdb's globals under them is what
   used to crash (a segmentation fault after "stopped.").

A second Ctrl-C while the demo flushes stops the server without waiting for it (a third does not
wait for open connections either). During the final steps a Ctrl-C is answered with a note (they
are bounded); another one ends the process at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import uvicorn

from alerts.services import deliveries_wait
from ingest.parse_pool import close_parse_pool
from ingest.writer import stop_writer

log = logging.getLogger("tracedash.serve")


def stop_in_order(*, demo, beat, store, notes: StopNotes, out, err) -> bool:
    """The orderly end (see the module docstring), its notes written to ``out`` and ``err`` (the
    command's stdout and stderr); True when every step finished cleanly."""
    previous = signal.signal(signal.SIGINT, notes) if main_thread() else None
    clean = True
    try:
        if demo is not None:
            demo.stop()  # normally done already, before the server stopped
        if beat is not None:
            beat.request_stop()  # winds down while the writer drains
        close_parse_pool()  # the ingest parse workers, if any (no request is left to parse)
        # The process's ingest writer, whoever started it (the requests, or the host sampler in the
        # beat): it writes what is queued (or spools it) before the store closes. None started: no-op.
        clean &= stop_writer()
        if beat is not None:
            clean &= beat.stop()
        deliveries_wait(timeout=30.0)  # notifications being sent: os._exit would cut them off
        if not store.close():
            clean = False
            err.write("tracedash: a ClickHouse call was still running after 60 s; "
                      "stopping without closing the store")
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    out.write("tracedash: stopped." if clean else "tracedash: stopped (not cleanly, see above).")
    out.flush()
    return clean


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def hard_exit(code: int) -> None:
    """Flush what was written, then end the process without the interpreter's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class DemoFirstServer(uvicorn.Server):
    """uvicorn's single-process server with tracedash's stop: the first Ctrl-C (or SIGTERM) runs
    ``before_stop`` (the demo's stop and flush) in a thread while the server goes on serving, then
    the server stops. The signal is not re-raised afterwards (uvicorn's own handler does that, and
    the KeyboardInterrupt it turns into could cut the orderly shutdown short)."""

    def __init__(self, config, *, before_stop=None, out=None):
        super().__init__(config)
        self.before_stop = before_stop
        self.out = out
        self._stop_thread: threading.Thread | None = None

    def handle_exit(self, sig, frame):
        if self._stop_thread is None and self.before_stop is not None:
            self._stop_thread = threading.Thread(target=self._stop_after, name="tracedash-stop", daemon=True)
            self._stop_thread.start()
            return
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a third Ctrl-C: do not wait for open connections
        self.should_exit = True

    def _stop_after(self):
        try:
            if self.out is not None:
                self.out.write("tracedash: stopping: the demo sends its last spans, then the server stops…")
                self.out.flush()
            self.before_stop()
        except Exception:  # noqa: BLE001 - the server must stop regardless
            log.exception("stopping the demo failed")
        finally:
            self.should_exit = True


class StopNotes:
    """SIGINT once the server has stopped and the final steps run: say what is happening (they are
    bounded); a second one ends the process at once. Before that, a plain KeyboardInterrupt."""

    def __init__(self):
        self.stopping = False
        self.count = 0

    def __call__(self, sig, frame):
        if not self.stopping:
            raise KeyboardInterrupt
        self.count += 1
        if self.count >= 2:
            hard_exit(130)
        try:
            os.write(2, b"tracedash: still stopping: writing queued spans and closing ClickHouse "
                        b"(Ctrl-C again ends at once)\n")
        except OSError:
            pass
