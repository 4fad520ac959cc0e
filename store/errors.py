"""The store's own exception types; driver errors are re-raised as these ``from`` the original."""


class StoreError(Exception):
    """A ClickHouse query failed. ``tag`` names the code that ran it."""

    def __init__(self, message: str, *, tag: str | None = None, code: int | None = None):
        self.tag = tag
        self.code = code
        super().__init__(f"[{tag}] {message}" if tag else message)


class StoreUnavailable(StoreError):
    """ClickHouse cannot be reached (network error, timeout, server down)."""


class DataDirLocked(StoreError):
    """Another process holds the embedded ClickHouse data directory."""


class StoreTimeout(StoreUnavailable):
    """ClickHouse took the query but did not answer within the client's ``send_receive_timeout``.
    Not retried by the store: resending a slow query would only double the wait and the load."""


class StoreAuthError(StoreUnavailable):
    """ClickHouse refused the login (unknown user, wrong or missing password). An outage for its
    callers (the ingest writer spools and waits; nothing is quarantined), fixed by configuration."""
