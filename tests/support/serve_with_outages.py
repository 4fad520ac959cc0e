"""``manage.py serve`` with a switch that makes ClickHouse unavailable, for the fault test.

While the file named by ``TRACEDASH_TEST_OUTAGE_FILE`` exists, every store call fails the way an
unreachable server does (``StoreUnavailable``); the rest of the server is the real one.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from store import StoreUnavailable  # noqa: E402
from store.client import Store  # noqa: E402

OUTAGE = Path(os.environ["TRACEDASH_TEST_OUTAGE_FILE"])


def _guard(method):
    def guarded(self, *args, **kwargs):
        if OUTAGE.exists():
            raise StoreUnavailable("ClickHouse is down (test outage)", tag=kwargs.get("tag"))
        return method(self, *args, **kwargs)

    return guarded


for name in ("query", "command", "insert"):
    setattr(Store, name, _guard(getattr(Store, name)))

call_command("serve", *sys.argv[1:])
