"""Production security settings (issue 9, point 3): TRACEDASH_HTTPS=1 turns on secure cookies and
HSTS (not under DEBUG); the proxy's scheme header is trusted only when configured; nosniff,
referrer policy and framing headers are always sent. Both modes are checked on the real settings
module in a fresh process (settings are read once at import)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config import env

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
names = ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER",
         "SECURE_REFERRER_POLICY", "SECURE_CONTENT_TYPE_NOSNIFF", "SESSION_COOKIE_HTTPONLY", "X_FRAME_OPTIONS"]
out = {n: getattr(settings, n) for n in names}
client = Client()
plain = client.get("/login/")
tls = client.get("/login/", secure=True)
proxied = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
out["plain"] = {h: plain.headers.get(h) for h in ("Strict-Transport-Security", "X-Content-Type-Options",
                                                   "Referrer-Policy", "X-Frame-Options")}
out["tls_hsts"] = tls.headers.get("Strict-Transport-Security")
out["proxied_hsts"] = proxied.headers.get("Strict-Transport-Security")
out["csrf_cookie_secure"] = bool(tls.cookies["csrftoken"]["secure"])
print("PROBE" + json.dumps(out))
"""


def _probe(tmp_path, **variables) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRACEDASH_") and k != "DATABASE_URL"}
    environ.update({"DJANGO_SETTINGS_MODULE": "config.settings", "TRACEDASH_DATA_DIR": str(tmp_path),
                    "TRACEDASH_DEMO": "0", "TRACEDASH_ALLOWED_HOSTS": "testserver", **variables})
    result = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=environ, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("PROBE")][-1]
    return json.loads(line[len("PROBE"):])


def test_plain_http_default_has_no_secure_cookies_or_hsts_but_always_the_basic_headers(tmp_path):
    out = _probe(tmp_path)
    assert out["SESSION_COOKIE_SECURE"] is False and out["CSRF_COOKIE_SECURE"] is False
    assert out["SECURE_HSTS_SECONDS"] == 0 and out["SECURE_PROXY_SSL_HEADER"] is None
    assert out["plain"] == {"Strict-Transport-Security": None, "X-Content-Type-Options": "nosniff",
                            "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"}
    assert out["tls_hsts"] is None and out["csrf_cookie_secure"] is False


def test_https_mode_sets_secure_cookies_and_hsts(tmp_path):
    out = _probe(tmp_path, TRACEDASH_HTTPS="1")
    assert out["SESSION_COOKIE_SECURE"] is True and out["CSRF_COOKIE_SECURE"] is True
    assert out["SECURE_HSTS_SECONDS"] == 31_536_000 and out["SESSION_COOKIE_HTTPONLY"] is True
    assert out["tls_hsts"] == "max-age=31536000"
    assert out["csrf_cookie_secure"] is True
    assert out["plain"]["Strict-Transport-Security"] is None  # HSTS only on HTTPS responses
    assert out["plain"]["X-Content-Type-Options"] == "nosniff"
    # No proxy header configured: a client claiming X-Forwarded-Proto: https is not believed.
    assert out["SECURE_PROXY_SSL_HEADER"] is None and out["proxied_hsts"] is None


def test_proxy_header_is_trusted_only_when_configured(tmp_path):
    out = _probe(tmp_path, TRACEDASH_HTTPS="1", TRACEDASH_PROXY_SSL_HEADER="X-Forwarded-Proto",
                 TRACEDASH_HSTS_SECONDS="300")
    assert out["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert out["proxied_hsts"] == "max-age=300"


def test_debug_turns_https_settings_off(tmp_path):
    out = _probe(tmp_path, TRACEDASH_HTTPS="1", TRACEDASH_DEBUG="1")
    assert out["SESSION_COOKIE_SECURE"] is False and out["SECURE_HSTS_SECONDS"] == 0


@pytest.mark.parametrize("variable, value, fragment", [
    ("TRACEDASH_HTTPS", "sometimes", "expected 1/0"),
    ("TRACEDASH_HSTS_SECONDS", "-1", "from 0"),
    ("TRACEDASH_PROXY_SSL_HEADER", "X-Forwarded-Proto: https", "header name"),
])
def test_bad_values_name_the_variable(tmp_path, variable, value, fragment):
    with pytest.raises(env.ConfigError) as caught:
        env.load({"TRACEDASH_DATA_DIR": str(tmp_path), variable: value})
    assert caught.value.variable == variable and fragment in str(caught.value)


def _deploy_warnings(tmp_path, **variables) -> set[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRACEDASH_") and k != "DATABASE_URL"}
    environ.update({"TRACEDASH_DATA_DIR": str(tmp_path), "TRACEDASH_DEMO": "0",
                    "TRACEDASH_SECRET_KEY": "k" * 20 + "Q9x!_-z8Vb2%&pLm4nT6wYr1sU3eH7jK0", **variables})
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=120)
    return set(re.findall(r"\(security\.(W\d{3})\)", result.stdout + result.stderr))


def test_deploy_check_is_clean_in_https_mode(tmp_path):
    """``manage.py check --deploy`` finds nothing but the deliberate choices: no SSL redirect in
    the app (the proxy redirects; /healthz is probed over plain HTTP) and no HSTS subdomains or
    preload (they bind hosts tracedash does not own). Without TRACEDASH_HTTPS it flags the
    cookies and HSTS, as it should."""
    assert _deploy_warnings(tmp_path, TRACEDASH_HTTPS="1") == {"W005", "W008", "W021"}
    assert {"W004", "W012", "W016"} <= _deploy_warnings(tmp_path)
