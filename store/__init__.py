"""tracedash's ClickHouse store: the single choke point for every query."""

from .backends import Columns, Result
from .client import Store, get_store, set_store, store_from_settings
from .errors import DataDirLocked, StoreAuthError, StoreBusy, StoreError, StoreTimeout, StoreUnavailable

__all__ = [
    "Columns",
    "DataDirLocked",
    "Result",
    "Store",
    "StoreAuthError",
    "StoreBusy",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "get_store",
    "set_store",
    "store_from_settings",
]
