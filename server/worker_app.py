"""The ASGI application of one web worker of ``manage.py serve --workers N``.

``config.asgi.application`` with the ASGI lifespan protocol answered: at startup the worker's own
group-commit writer starts (it claims a spool slot of its own and replays whatever a dead
worker's slot still holds); at shutdown, which uvicorn runs after the worker stopped accepting and
answered its open requests, the writer writes what is queued (or spools it) and the worker's
ClickHouse connection closes. Each worker is a separate process: nothing is shared but the
listening socket (bound once by the parent and handed to every worker), the metadata database,
ClickHouse and the data dir.
"""

from __future__ import annotations

import asyncio
import logging
import os

from config.asgi import application as django_application

log = logging.getLogger("tracedash.serve")


def _start() -> str:
    from ingest.writer import get_writer

    writer = get_writer()
    pending = writer.spool.pending()
    return f"tracedash: worker {os.getpid()} serving (spool {writer.spool.directory.name}" + (
        f", replaying {pending} spooled batch(es))" if pending else ")")


def _stop() -> str:
    from ingest.parse_pool import close_parse_pool
    from ingest.writer import current_writer, stop_writer
    from store import get_store

    close_parse_pool()  # its parse workers, if TRACEDASH_INGEST_PARSE_PROCESSES started any
    writer = current_writer()
    stats = dict(writer.stats) if writer is not None else {}
    clean = stop_writer()
    get_store().close()
    return (f"tracedash: worker {os.getpid()} stopped{'' if clean else ' (its writer did not finish)'}: "
            f"{stats.get('rows_stored', 0)} row(s) stored, {stats.get('rows_spooled', 0)} spooled")


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                print(await asyncio.to_thread(_start), flush=True)
            except Exception as exc:  # noqa: BLE001 - reported to uvicorn, which ends the worker
                log.exception("tracedash worker start failed")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                print(await asyncio.to_thread(_stop), flush=True)
            except Exception as exc:  # noqa: BLE001
                log.exception("tracedash worker stop failed")
                await send({"type": "lifespan.shutdown.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    else:
        await django_application(scope, receive, send)
