"""tracedash's ClickHouse store: the single choke point for every query."""

from .backends import Columns, Result, column_values
from .client import Store, get_store, set_store, store_from_settings, writes_table
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
    "column_values",
    "get_store",
    "set_store",
    "store_from_settings",
    "writes_table",
]
