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
