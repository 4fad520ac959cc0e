"""Memory the process freed, handed back to the system (glibc's side; ClickHouse's own allocator is
``Store.release_memory``).

Python's objects over 512 bytes (request bodies, decoded batches, query results, rendered pages)
come from glibc's malloc, which gives each thread that allocates an arena of its own (up to eight
per core) and returns the free space inside an arena only when it lies at the arena's top. A server
whose threads take turns with megabyte-sized batches and pages therefore grows its RSS by what it
freed, arena after arena. ``limit_arenas`` caps the arenas (``M_ARENA_MAX``: threads share them),
``trim`` returns the free pages of every arena (``malloc_trim``), and asks Arrow's own allocator
to return what it keeps for reuse. Where the C library is not glibc (musl, macOS) glibc's part does
nothing and both return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("tracedash.memory")

M_ARENA_MAX = -8  # glibc's mallopt parameter
SERVER_ARENAS = 2


@functools.cache
def _glibc():
    """glibc's handle, or None (another C library, or none found)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap() -> dict | None:
    """What glibc's malloc holds now, over all its arenas (``mallinfo2``, glibc 2.33 and later),
    bytes: ``heap_in_use_bytes`` (blocks allocated and not freed, the large ones mapped on their
    own included) and ``heap_free_bytes`` (freed blocks the arenas keep: what ``trim`` can return
    only where whole pages are free). None elsewhere. A rise of the first under steady load is
    something kept; of the second, fragmentation."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"heap_in_use_bytes": info.uordblks + info.hblkhd, "heap_free_bytes": info.fordblks}


def limit_arenas(arenas: int = SERVER_ARENAS) -> bool:
    """Cap glibc's malloc arenas for the rest of the process's life (threads started later share
    them); True when set."""
    libc = _glibc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(M_ARENA_MAX, arenas))
    if not ok:
        log.warning("mallopt(M_ARENA_MAX, %d) refused", arenas)
    return ok


def trim() -> bool:
    """Return the free pages of every malloc arena to the system, and those Arrow's own allocator
    (mimalloc: the embedded inserts' tables, the numpy summaries' columns) keeps for reuse; True
    when glibc did it."""
    import pyarrow  # here, not at start-up: a server process may never load it

    pyarrow.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
