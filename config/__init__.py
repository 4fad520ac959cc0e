import sys
from pathlib import Path

# The server runs the SDK it ships (sdk/, also pip-installable on its own as tracedash-sdk) for the
# demo workload and the load generator: make it importable wherever the server starts.
_SDK = str(Path(__file__).resolve().parent.parent / "sdk")
if _SDK not in sys.path:
    sys.path.append(_SDK)

from .celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
