"""CPU priority of this process's background threads (Linux, where a thread has a nice value of its
own and the threads it starts inherit it).

The embedded server does three kinds of work in one process: the requests (parsing, answering),
the in-process beat (summaries, rollups, alert rounds) and the embedded ClickHouse's merges of the
parts each insert writes. On a busy machine the last two can wait: a summary or a merge done a
moment later is the same one. With both at a higher nice value (``TRACEDASH_BACKGROUND_NICE``) the
cores go to the requests first and the background work takes what they leave; nothing is dropped,
and on an idle machine nothing changes. Raising one's own nice value needs no privilege; lowering
it back would (``CAP_SYS_NICE``), so a lowered thread stays lowered. ClickHouse's own setting for
its merge threads (``os_threads_nice_value_merge_mutate``) does nothing without that capability,
hence ``lower`` on the threads the embedded store started (``threads_named``).

``name_thread`` gives the calling thread its Python name in the kernel as well (Python 3.11 does
not), so ``top -H``, ``/proc/<pid>/task`` and ``bench/ingest.py --compare-beat``'s split of the
server's CPU by thread tell the writer, the inserter and the beat apart.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("tracedash.priority")

NICE_MAX = 19


def supported() -> bool:
    """Whether a thread's priority can be lowered alone (Linux; elsewhere ``setpriority`` would
    change the whole process)."""
    return sys.platform.startswith("linux")


def lower(by: int, tid: int | None = None) -> bool:
    """Raise the nice value of thread ``tid`` of this process (default: the calling thread) by
    ``by``, at most to 19. True when done; nothing happens where not ``supported`` or ``by`` is 0."""
    if by <= 0 or not supported():
        return False
    tid = threading.get_native_id() if tid is None else tid
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(NICE_MAX, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError as exc:  # the thread has ended; or a system that refuses even this
        log.warning("could not lower the CPU priority of thread %s: %s", tid, exc)
        return False
    return True


KERNEL_NAME_MAX = 15  # bytes of a thread name the kernel keeps
_PR_SET_NAME = 15


def name_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its Python name, ``tracedash-`` shortened to
    ``td-``) in the kernel, cut to 15 bytes. True when done (Linux)."""
    if not supported():
        return False
    name = name or threading.current_thread().name.replace("tracedash-", "td-", 1)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, name.encode()[:KERNEL_NAME_MAX], 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc with prctl: the name stays the process's
        return False


def nice_of(tid: int | None = None) -> int:
    """The nice value of thread ``tid`` of this process (default: the calling thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id() if tid is None else tid)


def threads_named(name: str) -> list[int]:
    """The ids of this process's threads whose kernel name is ``name`` (``/proc/self/task``; none
    where there is no /proc)."""
    found = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if fh.read().strip() == name:
                    found.append(int(tid))
        except OSError:  # ended meanwhile
            continue
    return sorted(found)
