"""The package layout shows the data flow — ingest → store → analytics → dashboard / alerts — and
the imports keep to it: analytics sits below the pages and alerts, alerts never reaches into the
dashboard, and no package imports another's private (``_name``) modules or names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name not in ("tests", "bench"))


def _imports(package: str):
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name, None
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    yield path, node.module, alias.name


def _offenders(package: str, forbidden: set[str]) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)}: {module}" for path, module, _ in _imports(package)
                  if module.split(".")[0] in forbidden)


def test_alerts_import_nothing_from_the_dashboard():
    assert _offenders("alerts", {"dashboard"}) == []


def test_analytics_sits_below_pages_alerts_and_load_tests():
    assert _offenders("analytics", {"dashboard", "alerts", "loadtests", "server"}) == []


def test_shared_chart_look_and_ingestion_do_not_import_pages():
    assert _offenders("charts", {"dashboard", "alerts", "loadtests"}) == []
    assert _offenders("ingest", {"dashboard", "alerts", "analytics", "loadtests"}) == []
    assert _offenders("store", {"dashboard", "alerts", "analytics", "ingest", "loadtests"}) == []


def test_no_package_reaches_into_another_packages_private_names():
    found = []
    for package in PACKAGES:
        for path, module, name in _imports(package):
            top = module.split(".")[0]
            if top == package or top not in PACKAGES:
                continue
            private_module = any(part.startswith("_") and not part.startswith("__") for part in module.split("."))
            private_name = name is not None and name.startswith("_") and not name.startswith("__")
            if private_module or private_name:
                found.append(f"{path.relative_to(ROOT)}: from {module} import {name}")
    assert found == []
