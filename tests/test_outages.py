"""Outages (issue 9, point 2): a dependency goes away, the product says so clearly (a 503 page or
JSON error, ``/healthz`` 503 naming it), keeps acknowledging ingestion where it can (spool), and
recovers by itself when the dependency returns, losing nothing acknowledged.

ClickHouse is made unavailable the way ``tests/support/serve_with_outages.py`` does it: every
store call raises ``StoreUnavailable`` while the outage is on (the writer's threads included,
since they run in this process). The other outages run a real ``manage.py serve`` process
(``tests.test_ingest_faults.Server``): the SQLite metadata file is replaced by a directory (no
connection can open it), a ``redis-server`` started here is SIGKILLed, and the spool directory is
a 2 MiB tmpfs (skipped where mounting is impossible)."""

from __future__ import annotations

import json
import secrets
import time

import pytest
from django.test import Client

from store import StoreUnavailable
from store.client import Store
from tests.conftest import wait_until
from tests.support.worker_server import start_redis_server
from tests.test_ingest_faults import stored_spans
from tests.test_security_matrix import MATRIX, world  # noqa: F401 - the fixture is used by name

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


@pytest.fixture
def clickhouse_outage(monkeypatch):
    """A switch: ``outage["on"] = True`` makes every store call fail as an unreachable server."""
    state = {"on": False}
    for name in ("query", "command", "insert"):
        original = getattr(Store, name)

        def guarded(self, *args, __original=original, **kwargs):
            if state["on"]:
                raise StoreUnavailable("ClickHouse is down (test outage)", tag=kwargs.get("tag"))
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, guarded)
    original_ping = Store.ping

    def ping(self, *args, **kwargs):
        if state["on"]:
            raise StoreUnavailable("ClickHouse is down (test outage)", tag="ping")
        return original_ping(self, *args, **kwargs)

    monkeypatch.setattr(Store, "ping", ping)
    return state


def _batch(n_traces: int = 5) -> tuple[bytes, set[tuple[str, str]]]:
    from tests.test_ingest_faults import batch

    return batch(n_traces, spans_per_trace=3, name="outage", prompt=None)


def _stored(project_id: int) -> tuple[set, int]:
    from store import get_store

    where = "WHERE project_id = {p:UInt64} AND startsWith(name, {prefix:String})"
    params = {"p": project_id, "prefix": "outage-"}
    rows = get_store().query(f"SELECT trace_id, span_id FROM spans {where}", params, tag="tests.outages").rows
    final = get_store().query(f"SELECT trace_id, span_id FROM spans FINAL {where}", params, tag="tests.outages").rows
    return {tuple(r) for r in final}, len(rows)


READ_URLS = [name for name, row in MATRIX.items() if row.kind in ("page", "json")]
# Pages whose content comes from ClickHouse: they must answer the "store down" 503. (Settings,
# alerts and load tests are metadata pages: they may still render, but never with a 500.)
CLICKHOUSE_PAGES = [name for name in READ_URLS if name.startswith("dashboard:") and name != "dashboard:settings"]


def test_clickhouse_outage_gives_clear_503s_spools_ingest_and_recovers(world, clickhouse_outage, client):
    from ingest.writer import get_writer

    alice = Client()
    alice.force_login(world.alice)
    for name in READ_URLS:  # baseline: everything works
        response = alice.get(MATRIX[name].path(world))
        assert response.status_code == MATRIX[name].member_status, (name, response.status_code)

    clickhouse_outage["on"] = True
    # Every page and JSON endpoint: never a 500; the ClickHouse-backed ones a clear 503.
    for name in READ_URLS:
        row = MATRIX[name]
        response = alice.get(row.path(world))
        assert response.status_code != 500, name
        if name in CLICKHOUSE_PAGES:
            assert response.status_code == 503, (name, response.status_code)
            if row.kind == "json" or response["Content-Type"].startswith("application/json"):
                body = response.json()
                assert "error" in body, (name, body)
            else:
                assert "trace store is unavailable" in response.content.decode(), name
        else:
            assert response.status_code in (row.member_status, 503), (name, response.status_code)

    health = client.get("/healthz")
    assert health.status_code == 503
    checks = health.json()["checks"]
    assert checks["clickhouse"]["ok"] is False and "down" in checks["clickhouse"]["error"]
    assert checks["database"]["ok"] is True

    # Ingestion still acknowledges: the spans go to the spool.
    acknowledged: set[tuple[str, str]] = set()
    for _ in range(3):
        body, ids = _batch()
        response = client.post("/api/v1/traces", body, content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {world.a_key}")
        assert response.status_code in (200, 202), (response.status_code, response.content)
        assert response.json()["accepted"] == len(ids)
        acknowledged |= ids
    wait_until(lambda: get_writer().health()["spooled_segments"] > 0, timeout=30, message="spans spooled")

    # ClickHouse returns: the spool replays by itself, pages and healthz recover.
    clickhouse_outage["on"] = False
    wait_until(lambda: get_writer().health()["spooled_segments"] == 0 and get_writer().health()["queued_rows"] == 0,
               timeout=60, message="spool replayed")
    stored, raw = _stored(world.a.pk)
    assert stored == acknowledged
    assert raw == len(acknowledged)  # stored exactly once, not only after FINAL
    assert client.get("/healthz").status_code == 200
    for name in READ_URLS:
        response = alice.get(MATRIX[name].path(world))
        assert response.status_code == MATRIX[name].member_status, (name, response.status_code)


# --- the metadata database goes away (a real server process) -------------------------------------
def _operator_key(env: dict, project: str) -> str:
    """Make the operator account ``op`` (password ``outage-pass-1``) and a project it is a member
    of, with the real management commands in ``env``; the project's ingest key."""
    import subprocess
    import sys

    from tests.test_serve import ROOT

    env = {**env, "DJANGO_SUPERUSER_PASSWORD": "outage-pass-1"}
    subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", "op",
                    "--email", "op@example.com"], cwd=ROOT, env=env, capture_output=True, check=True)
    return subprocess.run([sys.executable, "manage.py", "create_project", project, "--member", "op"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


def _session(base: str, username: str, password: str):
    """An opener logged in through the login form (CSRF cookie + token, as a browser does)."""
    import http.cookiejar
    import re
    import urllib.parse
    import urllib.request

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(base + "/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token}).encode()
    opener.open(urllib.request.Request(base + "/login/", data=data, headers={"Referer": base + "/login/"}), timeout=10)
    assert any(c.name == "sessionid" for c in jar), "login failed"
    return opener


def _get(opener, url: str) -> tuple[int, str, str]:
    import urllib.error

    try:
        with opener.open(url, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def _post_spans(base: str, key: str) -> tuple[int, str, str]:
    import urllib.request

    body, _ = _batch()
    request = urllib.request.Request(base + "/api/v1/traces", data=body, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    return _get(urllib.request.build_opener(), request)


@pytest.mark.django_db(transaction=True)
def test_metadata_database_outage_gives_clear_errors_and_recovers(tmp_path):
    import os
    import signal

    from tests.test_ingest_faults import Server
    from tests.test_serve import PRODUCTION_VARIABLES, _free_port

    data_dir = tmp_path / "var"
    server = Server(data_dir, tmp_path / "no-clickhouse-outage", _free_port())
    try:
        env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        env.update(TRACEDASH_DATA_DIR=str(data_dir))
        key = _operator_key(env, "dbdown")
        opener = _session(server.base, "op", "outage-pass-1")
        pages = ["/", "/traces/", "/settings/", "/alerts/", "/overview.json"]
        before = {page: _get(opener, server.base + page)[0] for page in pages}
        assert all(status == 200 for status in before.values()), before

        db = data_dir / "tracedash.sqlite3"
        moved = tmp_path / "moved.sqlite3"
        db.rename(moved)
        db.mkdir()  # the path now cannot be opened as a database: every connection attempt fails
        try:
            health = server.health()
            assert health["status"] == "unavailable"
            assert health["checks"]["database"]["ok"] is False, health
            assert health["checks"]["clickhouse"]["ok"] is True
            for page in pages:
                status, content_type, body = _get(opener, server.base + page)
                assert status == 503, (page, status, body[:300])
                assert "database" in body.lower(), (page, body[:300])
                if page.endswith(".json"):
                    assert content_type.startswith("application/json")
                    assert json.loads(body)["error"]["code"] == "database_unavailable"
            # Ingestion cannot check the key: a clear 503 JSON (not acknowledged, so the client resends).
            status, content_type, body = _post_spans(server.base, key)
            assert status == 503 and content_type.startswith("application/json"), (status, body[:300])
            assert json.loads(body)["error"]["code"] == "database_unavailable"
        finally:
            db.rmdir()
            moved.rename(db)
        assert server.health()["status"] == "ok"
        after = {page: _get(opener, server.base + page)[0] for page in pages}
        assert after == before
        status, _, body = _post_spans(server.base, key)
        assert status in (200, 202) and json.loads(body)["accepted"] == 15, (status, body[:300])
    finally:
        server.proc.send_signal(signal.SIGINT)
        server.proc.wait(30)


def _server_with(data_dir, tmp_path, extra_env: dict):
    """``tests.test_ingest_faults.Server`` (the real ``manage.py serve``) with extra variables."""
    import os
    from unittest import mock

    from tests.test_ingest_faults import Server
    from tests.test_serve import _free_port

    from tests.test_serve import PRODUCTION_VARIABLES

    # Server passes os.environ on without the production variables; let these through.
    kept = tuple(name for name in PRODUCTION_VARIABLES if name not in extra_env)
    with mock.patch.dict(os.environ, extra_env), mock.patch("tests.test_ingest_faults.PRODUCTION_VARIABLES", kept):
        server = Server(data_dir, tmp_path / "no-clickhouse-outage", _free_port())
    server.env.update(extra_env)
    return server


# --- Redis goes away in production mode (channel layer + Celery broker) ----------------------------
@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_redis_outage_keeps_ingest_and_pages_working_and_healthz_reports_it(tmp_path, how):
    """``killed``: connections are refused; ``frozen`` (SIGSTOP): Redis accepts nothing and answers
    nothing, the worse case for a client without timeouts."""
    import os
    import shutil
    import signal

    from tests.test_serve import PRODUCTION_VARIABLES, _free_port

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    redis_port = _free_port()

    redis = start_redis_server(redis_port)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    data_dir = tmp_path / "var"
    env_extra = {"TRACEDASH_CHANNEL_LAYER_URL": f"{redis_url}/1", "CELERY_BROKER_URL": f"{redis_url}/0"}
    server = None
    try:
        server = _server_with(data_dir, tmp_path, env_extra)
        env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        env.update(TRACEDASH_DATA_DIR=str(data_dir), **env_extra)
        key = _operator_key(env, "redisdown")
        opener = _session(server.base, "op", "outage-pass-1")
        pages = ["/", "/traces/", "/settings/", "/alerts/", "/overview.json"]
        before = {page: _get(opener, server.base + page)[0] for page in pages}
        assert all(status == 200 for status in before.values()), before
        health = server.health()
        assert health["status"] == "ok" and health["checks"]["redis"]["ok"] is True, health
        status, _, body = _post_spans(server.base, key)
        assert status in (200, 202), body[:300]

        if how == "killed":
            redis.send_signal(signal.SIGKILL)
            redis.wait(10)
        else:
            redis.send_signal(signal.SIGSTOP)
        health = server.health()
        assert health["status"] == "unavailable"
        assert health["checks"]["redis"]["ok"] is False and health["checks"]["redis"]["error"], health
        assert health["checks"]["clickhouse"]["ok"] is True and health["checks"]["database"]["ok"] is True
        started = time.monotonic()
        status, _, body = _post_spans(server.base, key)  # live events are best-effort: still acknowledged
        assert status in (200, 202) and json.loads(body)["accepted"] == 15, (status, body[:300])
        # It does not wait on Redis (ingest.services.LIVE_SEND_TIMEOUT_SECONDS; a frozen Redis held
        # each request ~5 s before); generous for a shared machine.
        assert time.monotonic() - started < 3
        during = {page: _get(opener, server.base + page)[0] for page in pages}
        assert during == before, (before, during)  # pages render as they did with Redis up

        if how == "killed":  # Redis returns: healthz recovers by itself
            redis = start_redis_server(redis_port)
        else:
            redis.send_signal(signal.SIGCONT)
        wait_until(lambda: server.health()["status"] == "ok", timeout=30, message="healthz ok again")
        status, _, body = _post_spans(server.base, key)
        assert status in (200, 202), body[:300]
    finally:
        if server is not None:
            server.proc.send_signal(signal.SIGINT)
            server.proc.wait(30)
        redis.send_signal(signal.SIGKILL)
        redis.wait(10)


# --- the data dir's disk is full (a 2 MiB tmpfs under the spool) --------------------------------
def _big_batch(n_traces: int = 4) -> tuple[bytes, set[tuple[str, str]]]:
    now = time.time_ns()
    spans, ids = [], set()
    for _ in range(n_traces):
        trace_id, root = secrets.token_hex(16), secrets.token_hex(8)
        for i in range(3):
            span_id = root if i == 0 else secrets.token_hex(8)
            spans.append({"trace_id": trace_id, "span_id": span_id, "parent_span_id": None if i == 0 else root,
                          "name": f"outage-{i}", "start_time": now - 10**9, "duration_ms": 5.0 + i,
                          "attributes": {"gen_ai.prompt": secrets.token_hex(10_000)}})  # incompressible
            ids.add((trace_id, span_id))
    return json.dumps({"spans": spans}).encode(), ids


def test_full_disk_refuses_ingest_with_503_retry_after_and_recovers(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tests.test_ingest_faults import Server
    from tests.test_serve import PRODUCTION_VARIABLES, ROOT, _free_port

    data_dir = tmp_path / "var"
    spool = data_dir / "spool"
    spool.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(spool)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    outage = tmp_path / "outage"
    server = None
    try:
        server = Server(data_dir, outage, _free_port())
        env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        env["TRACEDASH_DATA_DIR"] = str(data_dir)
        key = subprocess.run([sys.executable, "manage.py", "create_project", "diskfull"], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]

        def post(body: bytes):
            request = urllib.request.Request(server.base + "/api/v1/traces", data=body, headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.status, {k.lower(): v for k, v in response.headers.items()}, json.load(response)
            except urllib.error.HTTPError as exc:
                return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.load(exc)

        outage.touch()  # ClickHouse away: every acknowledgement comes from the spool, which fills the disk
        acknowledged: set[tuple[str, str]] = set()
        refused = None
        for _ in range(60):
            body, ids = _big_batch()
            status, headers, answer = post(body)
            if status in (200, 202):
                assert answer["accepted"] == len(ids)
                acknowledged |= ids
                continue
            assert status == 503, (status, answer)
            assert headers.get("retry-after"), headers
            assert answer["error"]["code"] == "spool_full", answer
            assert "disk" in answer["error"]["message"], answer
            refused = answer
            break
        assert refused is not None, "2 MiB of spool never filled up"
        assert acknowledged, "nothing was spooled before the disk filled"
        status, _, _ = post(_big_batch()[0])  # still full: still a clear 503, never a 500
        assert status == 503
        health = server.health()
        assert health["status"] != "ok" and health["checks"]["ingest"]["spool_disk_full"] is True, health

        outage.unlink()  # ClickHouse returns: the spool drains, the space returns, ingestion works again
        wait_until(lambda: server.health()["checks"]["ingest"]["spooled_segments"] == 0, timeout=60,
                   message="spool replayed")
        body, ids = _big_batch()
        status, _, answer = post(body)
        assert status in (200, 202), (status, answer)
        acknowledged |= ids
        wait_until(lambda: server.health()["checks"]["ingest"]["queued_rows"] == 0, timeout=60, message="queue empty")
    finally:
        if server is not None:
            server.proc.send_signal(signal.SIGINT)
            server.proc.wait(60)
        subprocess.run(["umount", "-l", str(spool)], capture_output=True)

    ids, raw = stored_spans(env, tag="tests.outages")
    assert set(ids) == acknowledged  # nothing acknowledged lost, nothing refused stored
    assert raw == len(acknowledged)  # exactly once


def test_server_error_handler_answers_503_only_for_database_errors(rf):
    from django.db import OperationalError

    from config.errors import server_error

    def answer(path: str, exc: Exception, **headers):
        try:
            raise exc
        except Exception:  # noqa: BLE001 - handler500 runs inside the exception, as Django calls it
            return server_error(rf.get(path, **headers))

    page = answer("/traces/", OperationalError("unable to open database file"))
    assert page.status_code == 503 and page["Retry-After"] and page["Content-Type"].startswith("text/html")
    assert b"metadata database is unavailable" in page.content
    api = answer("/api/v1/traces", OperationalError("connection refused"))
    assert api.status_code == 503 and api["Content-Type"].startswith("application/json")
    assert json.loads(api.content)["error"]["code"] == "database_unavailable"
    assert answer("/overview.json", OperationalError("x")).status_code == 503
    # Anything else is still a bug: a 500, with no detail of the exception in the body.
    other = answer("/traces/", ValueError("secret detail"))
    assert other.status_code == 500 and b"secret detail" not in other.content
    other_json = answer("/overview.json", KeyError("secret detail"))
    assert other_json.status_code == 500 and json.loads(other_json.content)["error"]["code"] == "server_error"


# --- PostgreSQL drops the server's connections mid-request ----------------------------------------
def test_postgres_connections_killed_mid_request_give_503_never_500_and_recover(tmp_path):
    """Production metadata DB: a real ``manage.py serve`` on its own PostgreSQL database while a
    thread keeps terminating every backend of that database (``pg_terminate_backend``, as a
    failover or an idle-killer would) under a stream of page, JSON and ingest requests. Every
    answer is a 200 or a clear 503, never a 500; once the killing stops, everything answers 200
    again without a restart; every acknowledged span is stored."""
    import os
    import signal
    import threading
    import urllib.request

    psycopg = pytest.importorskip("psycopg")
    from tests.test_serve import PRODUCTION_VARIABLES

    admin_url = os.environ.get("TRACEDASH_TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("TRACEDASH_REQUIRE_SERVICES"):
            raise RuntimeError(f"no PostgreSQL at {admin_url}, and TRACEDASH_REQUIRE_SERVICES is set") from exc
        pytest.skip(f"no PostgreSQL at {admin_url}: {exc}")
    name = f"tracedash_pgloss_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    database_url = admin_url.rsplit("/", 1)[0] + "/" + name
    data_dir = tmp_path / "var"
    server = None
    try:
        server = _server_with(data_dir, tmp_path, {"DATABASE_URL": database_url})
        env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        env.update(TRACEDASH_DATA_DIR=str(data_dir), DATABASE_URL=database_url)
        key = _operator_key(env, "pgloss")
        opener = _session(server.base, "op", "outage-pass-1")
        pages = ["/", "/traces/", "/settings/", "/alerts/", "/overview.json"]
        assert {page: _get(opener, server.base + page)[0] for page in pages} == dict.fromkeys(pages, 200)
        assert server.health()["checks"]["database"]["vendor"] == "postgresql"

        stop, killed = threading.Event(), [0]

        def killer():
            with psycopg.connect(admin_url, autocommit=True) as conn:
                while not stop.is_set():
                    killed[0] += conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid()", (name,)).fetchone()[0]
                    stop.wait(0.02)

        answers, acknowledged = [], set()
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                for page in pages:
                    status, content_type, body = _get(opener, server.base + page)
                    answers.append((page, status))
                    assert status in (200, 503), (page, status, body[:500])
                    if status == 503 and page.endswith(".json"):
                        assert json.loads(body)["error"]["code"] == "database_unavailable", body[:300]
                body, ids = _batch()
                request = urllib.request.Request(server.base + "/api/v1/traces", data=body, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
                status, content_type, text = _get(urllib.request.build_opener(), request)
                answers.append(("ingest", status))
                assert status in (200, 202, 503), (status, text[:500])
                if status in (200, 202):
                    assert json.loads(text)["accepted"] == len(ids)
                    acknowledged |= ids
                else:
                    assert content_type.startswith("application/json"), text[:300]
        finally:
            stop.set()
            thread.join(10)
        assert killed[0] > 0, "no backend was ever terminated: the test did not test anything"
        assert any(status == 503 for _, status in answers), f"no request was hit by a killed connection: {answers}"

        # The killing stopped: everything works again, with no restart.
        assert {page: _get(opener, server.base + page)[0] for page in pages} == dict.fromkeys(pages, 200)
        wait_until(lambda: server.health()["status"] == "ok", timeout=30, message="healthz ok again")
        status, _, body = _post_spans(server.base, key)
        assert status in (200, 202), body[:300]
        wait_until(lambda: server.health()["checks"]["ingest"]["queued_rows"] == 0, timeout=60, message="queue empty")
    finally:
        if server is not None:
            server.proc.send_signal(signal.SIGINT)
            server.proc.wait(60)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    ids, _ = stored_spans(server.env, tag="tests.outages")
    missing = acknowledged - set(ids)
    assert not missing, f"{len(missing)} acknowledged spans were not stored"
