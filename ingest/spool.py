"""The local spool: acknowledged rows that ClickHouse could not take yet, on disk, fsync'd.

A spool lives under ``<data dir>/spool/slot-N``; each web process claims one free slot with an
``flock`` (so several workers sharing a data dir never write the same files) and also drains slots
whose owner died. A segment is one write batch: ``<sequence>.seg``, msgpack of
``{"table", "token", "rows"}``, written to a temporary name, fsync'd, renamed into place and the
directory fsync'd, so after a crash a segment is either whole or absent. The token is the batch's
``insert_deduplication_token``: replaying a segment that ClickHouse already took stores nothing twice.

Replay groups. Replaying one segment per insert drains at the rate of inserts, which steady traffic
can outrun; so consecutive segments of one table are replayed together, up to a row limit, as one
insert (a *group*). Before the insert a manifest ``<first sequence>.grp`` (the segment names and the
group's token, fsync'd like a segment) fixes the group, so a retry after a failure or a crash
re-sends exactly the same rows with the same token, whatever arrived meanwhile. Once ClickHouse took
the group, the manifest is renamed to ``.done`` (atomic), then the segments are deleted, then the
``.done``; a ``.done`` found when a spool opens means its segments were stored and are deleted
first, so a crash part-way through the deletions never re-sends a subset under a new token.

A segment whose batch the writer already tried to insert directly (``solo``) is always replayed
alone with its own token: that first try may have been stored (a timeout after the commit), and only
the same token dedups it.

The journal. Under concurrent load the writer acknowledges a batch of spans once it is written here
as a *journal* segment, ``<sequence>.jrn`` (an Arrow IPC stream whose schema metadata carries the
table and the token; fsync'd and renamed into place as a segment is), and inserts the batches that
accumulated in one statement a moment later (``ingest.writer``). Before that insert a manifest
``<first sequence>.jgr`` fixes the group and its token; once ClickHouse took it, the manifest becomes a
``.done`` and the files go, as for a replay group. The replayer never reads journal files while their
process lives. When a spool is opened (a restart, or an orphan slot drained), its journal becomes
spool segments: each ``.jgr`` a ``.grp`` over the same segments, re-sent first with the same token
(its insert may have been stored before the crash), then every ``.jrn`` a ``.seg``, in sequence order;
the writer does the same when ClickHouse refuses a journal insert (``adopt_journal``).
"""

from __future__ import annotations

import errno
import hashlib
import fcntl
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import msgspec

MAX_SLOTS = 64


class SpoolFull(Exception):
    """The spool reached its size limit, or the disk under it is full: the API answers 503 until
    it drains."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_ARROW_STREAM = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message starts so; msgpack never does
JOURNAL = ".jrn"
JOURNAL_GROUP = ".jgr"


@dataclass(frozen=True)
class Segment:
    path: Path
    table: str
    token: str
    rows: list
    solo: bool = True  # replayed alone, with its own token (its batch was tried directly once)


@dataclass(frozen=True)
class Group:
    """Segments replayed as one insert under one token, fixed by an fsync'd manifest."""

    manifest: Path
    table: str
    token: str
    segments: list  # [Segment], oldest first


def group_token(tokens: list[str]) -> str:
    """The deduplication token of a replay group: a function of its segments' tokens only, so
    the same group always carries the same token."""
    return "g-" + hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:40]


class Spool:
    def __init__(self, directory: Path, *, max_bytes: int):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lock_handle = None
        self.directory.mkdir(parents=True, exist_ok=True)
        for done in sorted(self.directory.glob("*.done")):  # a group was stored, its deletions interrupted
            self._finish_done(done, _unlink)  # (the segments are counted below, after this)
        self._adopt_journal_files()  # a journal left by a process that stopped: segments to replay
        self._next = max((int(p.stem) for p in self.directory.glob("*.seg")), default=0) + 1
        for stale in self.directory.glob("*.tmp"):  # a write interrupted before its rename
            stale.unlink(missing_ok=True)
        self.replay_lock = threading.Lock()  # one replay of this spool at a time (groups are stateful)
        existing = list(self.directory.glob("*.seg"))
        self._bytes = sum(p.stat().st_size for p in existing)
        self._count = len(existing)
        self.disk_full = False  # the last write failed for want of space (cleared by the next success)

    # --- claiming a slot ---------------------------------------------------------------------
    @classmethod
    def claim(cls, root: Path, *, max_bytes: int) -> "Spool":
        """The first slot under ``root`` no live process holds; the lock lasts while we live."""
        root.mkdir(parents=True, exist_ok=True)
        for n in range(MAX_SLOTS):
            handle = _try_lock(root / f"slot-{n}")
            if handle is not None:
                spool = cls(root / f"slot-{n}", max_bytes=max_bytes)
                spool._lock_handle = handle
                return spool
        raise RuntimeError(f"all {MAX_SLOTS} spool slots under {root} are held by live processes")

    @classmethod
    def orphans(cls, root: Path, *, max_bytes: int) -> list["Spool"]:
        """Slots with segments whose owner is gone (locked for us while we drain them)."""
        found = []
        for directory in sorted(root.glob("slot-*")):
            if not any(directory.glob("*.seg")) and not any(directory.glob("*" + JOURNAL)):
                continue
            handle = _try_lock(directory)
            if handle is not None:
                spool = cls(directory, max_bytes=max_bytes)
                spool._lock_handle = handle
                found.append(spool)
        return found

    def release(self) -> None:
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    # --- segments ----------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self._bytes

    def pending(self) -> int:
        return self._count

    def append(self, table: str, token: str, rows: list, *, limit: int | None = None, solo: bool = True) -> Path:
        """Store one batch, fsync'd. ``solo=False`` only for a batch never sent to ClickHouse
        (nothing can have stored it under its token), which may then be replayed in a group."""
        data = msgspec.msgpack.encode({"table": table, "token": token, "rows": rows, "solo": solo})
        limit = self.max_bytes if limit is None else limit
        with self._lock:
            if self._bytes + len(data) > limit:
                raise SpoolFull(f"the ingest spool holds {self._bytes} bytes (limit {limit})")
            sequence = self._next
            self._next += 1
            final = self.directory / f"{sequence:016d}.seg"
            temporary = final.with_suffix(".tmp")
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(temporary, final)
                _fsync_dir(self.directory)
            except OSError as exc:
                temporary.unlink(missing_ok=True)
                if exc.errno in _DISK_FULL:
                    self.disk_full = True
                    raise SpoolFull(f"the disk under the ingest spool ({self.directory}) is full: {exc.strerror}") from exc
                raise
            self.disk_full = False
            self._bytes += len(data)
            self._count += 1
        return final

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.seg"))

    def read(self, path: Path) -> Segment:
        data = path.read_bytes()
        if data[:4] == _ARROW_STREAM:  # a journal segment (Arrow), adopted into the spool
            import pyarrow as pa

            from store import Columns

            arrow = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
            meta = arrow.schema.metadata or {}
            return Segment(path=path, table=meta[b"tracedash.table"].decode(), token=meta[b"tracedash.token"].decode(),
                           rows=Columns.from_arrow(arrow.replace_schema_metadata(None)),
                           solo=meta.get(b"tracedash.solo") == b"1")
        payload = msgspec.msgpack.decode(data)
        return Segment(path=path, table=payload["table"], token=payload["token"], rows=payload["rows"],
                       solo=payload.get("solo", True))  # segments from before groups: alone, as then

    # --- the journal -------------------------------------------------------------------------
    def journal(self, table: str, token: str, arrow) -> Path:
        """Write one batch (a pyarrow table of ``table``'s insert columns) as a journal segment,
        fsync'd: durable from the return on. Raises ``OSError`` (a full disk, say): the caller then
        writes the batch the way it did before the journal."""
        import pyarrow as pa

        arrow = arrow.replace_schema_metadata({"tracedash.table": table, "tracedash.token": token,
                                               "tracedash.solo": "0"})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, arrow.schema) as writer:
            writer.write_table(arrow)
        with self._lock:
            sequence = self._next
            self._next += 1
        final = self.directory / f"{sequence:016d}{JOURNAL}"
        _write_durably(self.directory, final, sink.getvalue())
        return final

    def fix_journal_group(self, table: str, token: str, paths: list[Path]) -> Path:
        """The manifest of a journal insert (fsync'd), written before the insert is sent."""
        manifest = paths[0].with_suffix(JOURNAL_GROUP)
        _write_durably(self.directory, manifest,
                       msgspec.msgpack.encode({"table": table, "token": token, "segments": [p.name for p in paths]}))
        return manifest

    def finish_journal_group(self, manifest: Path) -> None:
        """ClickHouse took the journal insert: mark it done (atomic), then delete its files."""
        done = manifest.with_suffix(".done")
        os.rename(manifest, done)
        _fsync_dir(self.directory)
        self._finish_done(done, _unlink)  # journal files are not counted in the spool's size

    def adopt_journal(self, paths: list[Path], manifest: Path | None = None) -> None:
        """Journal segments become spool segments, replayed by the replayer in sequence order; the
        manifest of an insert that was tried becomes a replay group over them, re-sent first with
        its token."""
        with self._lock:
            self._adopt(paths, manifest)
            _fsync_dir(self.directory)

    def _adopt(self, paths: list[Path], manifest: Path | None) -> None:
        if manifest is not None:
            payload = msgspec.msgpack.decode(manifest.read_bytes())
            payload["segments"] = [Path(name).with_suffix(".seg").name for name in payload["segments"]]
            _write_durably(self.directory, manifest.with_suffix(".grp"), msgspec.msgpack.encode(payload))
        for path in paths:
            target = path.with_suffix(".seg")
            try:
                os.rename(path, target)
            except FileNotFoundError:  # adopted before a crash that stopped short of the manifest's removal
                continue
            self._bytes += target.stat().st_size
            self._count += 1
        if manifest is not None:
            manifest.unlink(missing_ok=True)

    def _adopt_journal_files(self) -> None:
        """At open: the journal of a process that stopped, as spool segments (see the module's doc)."""
        self._bytes = self._count = 0  # counted again below, after the adoption
        for manifest in sorted(self.directory.glob("*" + JOURNAL_GROUP)):
            names = msgspec.msgpack.decode(manifest.read_bytes())["segments"]
            self._adopt([self.directory / name for name in names], manifest)
        self._adopt(sorted(self.directory.glob("*" + JOURNAL)), None)
        _fsync_dir(self.directory)

    # --- replay groups -----------------------------------------------------------------------
    def pending_group(self) -> Group | None:
        """The group a previous replay fixed and did not finish (re-sent before anything else)."""
        for manifest in sorted(self.directory.glob("*.grp")):
            payload = msgspec.msgpack.decode(manifest.read_bytes())
            # Every segment of a fixed group stays until it is marked done; skipping one that is
            # gone anyway (removed by hand) keeps the token, which is what dedups a re-send.
            segments = [self.read(self.directory / name) for name in payload["segments"]
                        if (self.directory / name).exists()]
            if not segments:
                self.drop_group(Group(manifest, payload["table"], payload["token"], []))
                continue
            return Group(manifest=manifest, table=payload["table"], token=payload["token"], segments=segments)
        return None

    def fix_group(self, segments: list[Segment]) -> Group:
        """Write the manifest of a group of consecutive non-solo segments of one table (fsync'd)."""
        assert segments and len({s.table for s in segments}) == 1 and not any(s.solo for s in segments)
        token = group_token([s.token for s in segments])
        manifest = self.directory / f"{segments[0].path.stem}.grp"
        data = msgspec.msgpack.encode({"table": segments[0].table, "token": token,
                                       "segments": [s.path.name for s in segments]})
        _write_durably(self.directory, manifest, data)
        return Group(manifest=manifest, table=segments[0].table, token=token, segments=segments)

    def finish_group(self, group: Group) -> None:
        """ClickHouse took the group: mark it done (atomic), then delete its segments and the mark."""
        done = group.manifest.with_suffix(".done")
        os.rename(group.manifest, done)
        _fsync_dir(self.directory)
        self._finish_done(done, self.remove)

    def drop_group(self, group: Group) -> None:
        """Forget a group ClickHouse refused as data (nothing of it was stored): its segments stay
        and are replayed one by one."""
        group.manifest.unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def _finish_done(self, done: Path, remove) -> None:
        """A stored group's files deleted with ``remove``, then its ``.done`` mark."""
        payload = msgspec.msgpack.decode(done.read_bytes())
        for name in payload["segments"]:
            remove(self.directory / name)
        _fsync_dir(self.directory)
        done.unlink()
        _fsync_dir(self.directory)

    def remove(self, path: Path) -> None:
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:  # another replay of this spool took it first (its token dedups the insert)
                return
            _fsync_dir(self.directory)
            self._bytes -= size
            self._count -= 1
            self.disk_full = False  # space was freed: the next write may succeed

    def quarantine(self, path: Path) -> Path:
        """Move a segment out of the replay order (kept on disk for an operator)."""
        target_dir = self.directory / "quarantine"
        target_dir.mkdir(exist_ok=True)
        target = target_dir / path.name
        with self._lock:
            size = path.stat().st_size
            os.rename(path, target)
            _fsync_dir(self.directory)
            self._bytes -= size
            self._count -= 1
        return target


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _try_lock(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / "lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _write_durably(directory: Path, final: Path, data: bytes) -> None:
    temporary = final.with_name(final.name + ".tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, final)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
