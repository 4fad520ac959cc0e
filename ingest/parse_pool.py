"""Native JSON batches parsed in worker processes (``TRACEDASH_INGEST_PARSE_PROCESSES``).

One server process parses every request body on the thread that holds Python's lock, so however
many cores the machine has, the endpoint's validation runs on one of them at a time. With
``TRACEDASH_INGEST_PARSE_PROCESSES=N`` the native endpoint hands each body to a pool of ``N``
processes instead. A worker validates it exactly as the server would (``parse_span_columns``),
builds the insert's Arrow table (``store.backends.arrow_table``) and sends it back as an Arrow IPC
stream. The server reads that stream without copying, and the writer inserts its columns as they
are. While the workers parse, the server's event loop answers other requests and the writer
inserts.

Only the common case takes this path: a body of at least ``MIN_BODY_BYTES`` (a smaller one is parsed
in the server, where it costs less than the hop). A batch where any span carries a score comes back as
Python lists, so that the endpoint splits the scores out as before. A batch that is not a batch
at all comes back as the same error the in-process parse raises. If the pool breaks (a worker
killed), the endpoint parses in process and the pool is started again on the next request.

Django-free: the workers import this module, ``ingest.schemas``, ``ingest.scores`` and ``store``
only.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from store import Columns

from .schemas import SPAN_COLUMNS, SPAN_TYPES, EnvelopeError, Limits, TooManyItems, parse_span_columns
from .scores import has_score_keys

log = logging.getLogger(__name__)

# Smaller bodies are parsed in the server: the hop to a worker and back (the body pickled, the Arrow
# stream, a future resolved on the event loop) cost more than the parse it saves. With two workers,
# json-100's 113 KiB bodies went 12.0-13.6k spans/s against 13.6-20.5k parsed in process, while
# json-1000's 1.1 MiB went 31.0-34.5k against 26.8-27.0k (docs/BENCHMARKS.md).
MIN_BODY_BYTES = 256 * 1024


def parse_in_worker(body: bytes, project_id: int, limits: Limits, max_items: int | None):
    """What a worker returns for one body (picklable, never an exception of ours):
    ``("arrow", ipc_bytes, rejected)``, ``("lists", columns, count, rejected)`` when a span carries
    a score, ``("envelope", code, message)`` or ``("too_many", count, maximum)``."""
    import pyarrow as pa

    from store.backends import arrow_table

    try:
        columns, rejected = parse_span_columns(body, project_id=project_id, limits=limits, max_items=max_items)
    except EnvelopeError as exc:
        return ("envelope", exc.code, exc.message)
    except TooManyItems as exc:
        return ("too_many", exc.count, exc.maximum)
    if any(map(has_score_keys, columns.column("attributes"), columns.column("event_names"))):
        return ("lists", columns.columns, columns.count, rejected)
    table = arrow_table(SPAN_COLUMNS, SPAN_TYPES, columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return ("arrow", sink.getvalue().to_pybytes(), rejected)


def _result(outcome) -> tuple[Columns, list]:
    """A worker's answer as ``parse_span_columns`` gives it (or raises it)."""
    kind = outcome[0]
    if kind == "arrow":
        import pyarrow as pa

        return Columns.from_arrow(pa.ipc.open_stream(outcome[1]).read_all()), outcome[2]
    if kind == "lists":
        return Columns(outcome[1], outcome[2]), outcome[3]
    if kind == "envelope":
        raise EnvelopeError(outcome[1], outcome[2])
    raise TooManyItems(outcome[1], outcome[2])


def _warm() -> None:
    """A worker's start: the imports the first body would pay for."""
    import pyarrow  # noqa: F401

    import store.backends  # noqa: F401


class ParsePool:
    """``processes`` worker processes (spawned: the server's chdb threads must not be forked)."""

    def __init__(self, processes: int):
        self.processes = processes
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False

    def _pool(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None
            if self._executor is None:
                self._executor = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=_warm)
            return self._executor

    def start(self) -> None:
        """Start the workers now (each imports its modules), not on the first request."""
        pool = self._pool()
        if pool is not None:
            for future in [pool.submit(_warm) for _ in range(self.processes)]:
                future.result()

    async def parse(self, body: bytes, *, project_id: int, limits: Limits,
                    max_items: int | None = None) -> tuple[Columns, list]:
        """``parse_span_columns`` of ``body``, in a worker; in this process when the body is small
        or the pool is closed or broken."""
        pool = self._pool() if len(body) >= MIN_BODY_BYTES else None
        if pool is not None:
            try:
                outcome = await asyncio.wrap_future(pool.submit(parse_in_worker, body, project_id, limits, max_items))
            except BrokenProcessPool:
                log.warning("ingest parse workers stopped; parsing in process, starting them again")
                with self._lock:
                    if self._executor is pool:
                        self._executor = None
                pool.shutdown(wait=False, cancel_futures=True)
            except RuntimeError:  # shut down meanwhile (the server is stopping): parse here
                pass
            else:
                return _result(outcome)
        return parse_span_columns(body, project_id=project_id, limits=limits, max_items=max_items)

    def close(self) -> None:
        """Stop the workers (they finish the bodies they hold); later parses run in process."""
        with self._lock:
            self._closed = True
            pool, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


_pool: ParsePool | None = None
_pool_lock = threading.Lock()


def parse_pool(processes: int) -> ParsePool | None:
    """The process's pool of ``processes`` workers (None for 0: parse in process)."""
    global _pool
    if processes <= 0:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = ParsePool(processes)
        return _pool


def close_parse_pool() -> None:
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()
