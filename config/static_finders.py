"""plotly.js, served by the app from the plotly package's own bundled file (never a CDN).

The finder exposes exactly one file, ``vendor/plotly.min.js``, so ``{% static %}``, WhiteNoise
(which lists finders at start-up) and ``collectstatic`` all see it like any other static file,
and the version served is always the one the Python package was built against.
"""

from __future__ import annotations

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PLOTLY_FILE = "plotly.min.js"
PREFIX = "vendor"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PLOTLY_DIR))
        self.storage.prefix = PREFIX  # staticfiles and WhiteNoise put this before listed paths

    def check(self, **kwargs):
        from django.core.checks import Error

        if not (PLOTLY_DIR / PLOTLY_FILE).is_file():
            return [Error(f"plotly.js not found at {PLOTLY_DIR / PLOTLY_FILE}", id="tracedash.E001")]
        return []

    def find(self, path, find_all=False, **kwargs):
        if path == f"{PREFIX}/{PLOTLY_FILE}":
            match = str(PLOTLY_DIR / PLOTLY_FILE)
            return [match] if find_all else match
        return [] if find_all else None

    def list(self, ignore_patterns):
        yield PLOTLY_FILE, self.storage
