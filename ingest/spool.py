"""The local spool: acknowledged rows that ClickHouse could not take yet, on disk, fsync'd.

A spool lives under ``<data dir>/spool/slot-N``; each web process claims one free slot with an
``flock`` (so several workers sharing a data dir never write the same files) and also drains slots
whose owner died. A segment is one write batch: ``<sequence>.seg``, msgpack of
``{"table", "token", "rows"}``, written to a temporary name, fsync'd, renamed into place and the
directory fsync'd, so after a crash a segment is either whole or absent. The token is the batch's
``insert_deduplication_token``: replaying a segment that ClickHouse already took stores nothing twice.
"""

from __future__ import annotations

import errno
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


@dataclass(frozen=True)
class Segment:
    path: Path
    table: str
    token: str
    rows: list


class Spool:
    def __init__(self, directory: Path, *, max_bytes: int):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lock_handle = None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._next = max((int(p.stem) for p in self.directory.glob("*.seg")), default=0) + 1
        for stale in self.directory.glob("*.tmp"):  # a write interrupted before its rename
            stale.unlink(missing_ok=True)
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
            if not any(directory.glob("*.seg")):
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

    def append(self, table: str, token: str, rows: list, *, limit: int | None = None) -> Path:
        data = msgspec.msgpack.encode({"table": table, "token": token, "rows": rows})
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
        payload = msgspec.msgpack.decode(path.read_bytes())
        return Segment(path=path, table=payload["table"], token=payload["token"], rows=payload["rows"])

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


def _try_lock(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / "lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
