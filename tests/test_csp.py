"""Content-Security-Policy (issue 9, point 3): the header is on every response, and no template
carries inline script (a ``<script>`` body other than a JSON data block, or an ``on*=``
attribute), which ``script-src 'self'`` would block. The browser side is tests/test_csp_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.template import engines
from django.test import Client

from config.csp import POLICY

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
HANDLER = re.compile(r"<[^>]*\son[a-z]+\s*=", re.I)


def _templates() -> list[Path]:
    dirs = [Path(d) for d in engines["django"].dirs] + list(ROOT.glob("*/templates"))
    return sorted({p for d in dirs if d.is_dir() for p in d.rglob("*.html")})


def test_templates_have_no_inline_script():
    templates = _templates()
    assert any(p.name == "base.html" for p in templates) and len(templates) > 10
    found = []
    for path in templates:
        text = path.read_text()
        for attrs, body in SCRIPT.findall(text):
            if "src=" not in attrs and 'type="application/json"' not in attrs and body.strip():
                found.append(f"{path.relative_to(ROOT)}: inline <script> body")
        found.extend(f"{path.relative_to(ROOT)}: {m.group(0)[:60]}" for m in HANDLER.finditer(text))
    assert not found, found


def test_policy_allows_only_this_server():
    directives = dict(d.split(" ", 1) for d in POLICY.split("; "))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe-eval" not in POLICY and "http" not in POLICY and "*" not in POLICY


@pytest.mark.django_db
def test_header_is_on_pages_json_and_ingest_errors(make_user):
    client = Client()
    assert client.get("/login/")["Content-Security-Policy"] == POLICY
    assert client.get("/overview.json")["Content-Security-Policy"] == POLICY
    assert client.post("/api/v1/traces", data=b"{}", content_type="application/json")["Content-Security-Policy"] == POLICY
    client.force_login(make_user())
    assert client.get("/settings/")["Content-Security-Policy"] == POLICY
