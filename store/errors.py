"""The store's own exception types; driver errors are re-raised as these ``from`` the original."""


class StoreError(Exception):
    """A ClickHouse query failed. ``tag`` names the code that ran it."""

    def __init__(self, message: str, *, tag: str | None = None, code: int | None = None):
        self.tag = tag
        self.code = code
        super().__init__(f"[{tag}] {message}" if tag else message)


class StoreUnavailable(StoreError):
    """ClickHouse cannot be reached (network error, timeout, server down)."""


class StoreBusy(StoreUnavailable):
    """ClickHouse answered but cannot take the query now: out of memory, too many parts or queries,
    a read-only table, a cancelled or aborted query. Not a verdict on the data: the ingest writer
    spools and retries a batch that met it, and never counts it toward quarantining a segment."""


# ClickHouse error codes that say "not now" rather than "not this" (src/Common/ErrorCodes.cpp).
BUSY_CODES = frozenset({
    159,  # TIMEOUT_EXCEEDED
    173,  # CANNOT_ALLOCATE_MEMORY
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    243,  # NOT_ENOUGH_SPACE
    252,  # TOO_MANY_PARTS
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED
    439,  # CANNOT_SCHEDULE_TASK
    473,  # DEADLOCK_AVOIDED
})


def query_error(message: str, *, tag: str | None = None, code: int | None = None) -> StoreError:
    """The store's exception for a query ClickHouse answered with an error: ``StoreBusy`` for the
    codes of ``BUSY_CODES``, a plain ``StoreError`` (the query or its data) otherwise."""
    kind = StoreBusy if code in BUSY_CODES else StoreError
    return kind(message, tag=tag, code=code)


class DataDirLocked(StoreError):
    """Another process holds the embedded ClickHouse data directory."""


class StoreTimeout(StoreUnavailable):
    """ClickHouse took the query but did not answer within the client's ``send_receive_timeout``.
    Not retried by the store: resending a slow query would only double the wait and the load."""


class StoreAuthError(StoreUnavailable):
    """ClickHouse refused the login (unknown user, wrong or missing password). An outage for its
    callers (the ingest writer spools and waits; nothing is quarantined), fixed by configuration."""
