"""ClickHouse reads are scoped to the project and user input never reaches SQL text (issue 9,
point 3). Every ClickHouse query the app runs while a member loads every page and JSON endpoint
of the security matrix (with filter values in the query string: a plain word that passes the
validators and a hostile one) and while ingest keys are used is recorded at ``Store.query``:
each read of a project table names ``project_id`` and carries the member's project id as a
server-side parameter (never the other project's), and neither value appears in any SQL text."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from django.test import Client

from store.client import Store
from store.schema import TABLES
from tests.test_security_matrix import MATRIX, world  # noqa: F401  (world: the fixture)

ROOT = Path(__file__).resolve().parent.parent

PLAIN = "zqplainmarkerzq"
HOSTILE = "zqx') OR 1=1 --\"`zq"
FILTER_KEYS = ("service", "model", "host", "engine", "status", "phase", "attr", "q", "name", "endpoint", "sort")


@pytest.fixture
def recorded(monkeypatch):
    calls: list[tuple[str, dict, str]] = []
    original = Store.query

    def query(self, sql, params=None, *, tag):
        calls.append((sql, dict(params or {}), tag))
        return original(self, sql, params, tag=tag)

    monkeypatch.setattr(Store, "query", query)
    return calls


def _reads_project_table(sql: str) -> bool:
    return any(re.search(rf"\b(FROM|JOIN)\s+(\w+\.)?{re.escape(name)}\b", sql, re.I) for name in TABLES)


def _check(calls, project_id: int, other_id: int) -> list[str]:
    problems = []
    for sql, params, tag in calls:
        for marker in (PLAIN, HOSTILE, "zqx"):
            if marker in sql:
                problems.append(f"{tag}: user input in SQL text")
        if not _reads_project_table(sql):
            continue
        if "project_id" not in sql:
            problems.append(f"{tag}: reads a project table without project_id")
        values = set()
        for value in params.values():
            values.update(value if isinstance(value, (list, tuple, set)) else [value])
        if project_id not in values:
            problems.append(f"{tag}: the project id is not a parameter ({sorted(map(str, params))})")
        wrong = [k for k, v in params.items() if "project" in k.lower() and v != project_id]
        if other_id in values and wrong:
            problems.append(f"{tag}: another project's id as a parameter ({wrong})")
    return problems


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_member_pages_and_json_read_only_their_project(world, recorded):
    alice = Client()
    alice.force_login(world.alice)
    names = [n for n, row in MATRIX.items() if row.kind in ("page", "json")]
    for marker in (PLAIN, HOSTILE):
        extra = "&".join(f"{key}={marker}" if key != "attr" else f"attr=user.id%3D{marker}" for key in FILTER_KEYS)
        for name in names:
            url = MATRIX[name].path(world)
            response = alice.get(url + ("&" if "?" in url else "?") + extra)
            assert response.status_code < 500, (name, response.status_code)
    # Plain values (so the filters are really applied) as well, one at a time.
    for key in ("service", "model"):
        alice.get(f"/traces/rows.json?project={world.a.pk}&{key}={PLAIN}")
        alice.get(f"/api/v1/series/latency?project={world.a.pk}&{key}={PLAIN}")
    alice.get(f"/traces/rows.json?project={world.a.pk}&attr=user.id%3D{PLAIN}")
    reads = [(sql, params) for sql, params, _ in recorded if _reads_project_table(sql)]
    assert len(reads) > 40
    # The filter values did reach the queries, as parameters.
    assert any(PLAIN in str(params.values()) for _, params in reads)
    assert not _check(recorded, world.a.pk, world.b.pk), sorted(set(_check(recorded, world.a.pk, world.b.pk)))


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_key_reads_only_the_keys_project(world, recorded):
    Client().get(f"/api/v1/traces/{world.trace}", HTTP_AUTHORIZATION=f"Bearer {world.b_key}")
    Client().get(f"/api/v1/traces/{world.b_trace}", HTTP_AUTHORIZATION=f"Bearer {world.b_key}")
    assert recorded
    assert not _check(recorded, world.b.pk, world.a.pk)


def test_the_check_flags_unscoped_reads_and_inlined_input():
    assert _check([("SELECT count() FROM spans", {}, "t1")], 1, 2) == [
        "t1: reads a project table without project_id", "t1: the project id is not a parameter ([])"]
    assert _check([(f"SELECT 1 FROM traces WHERE project_id = {{p:UInt64}} AND service = '{PLAIN}'", {"p": 1}, "t2")],
                  1, 2) == ["t2: user input in SQL text"]
    assert _check([("SELECT 1 FROM spans WHERE project_id = {project_id:UInt64}", {"project_id": 2}, "t3")], 1, 2) == [
        "t3: the project id is not a parameter (['project_id'])", "t3: another project's id as a parameter (['project_id'])"]
    assert _check([("SELECT 1 FROM spans WHERE project_id = {p:UInt64}", {"p": 1}, "ok")], 1, 2) == []


# Functions whose SQL reads FROM a source their caller built (already filtered by project_id).
BUILT_BY_CALLER = {("analytics/rollups.py", "_quantiles_query")}
# Reads of every project on purpose, answering no one's request: the summariser's store-wide filter
# of summarised traces is sized by the count of all summaries (analytics.trace_presence).
WHOLE_STORE = {("analytics/trace_presence.py", "_ensure_filter")}


def test_every_function_reading_a_project_table_names_project_id():
    """Every function of the application (selectors, panels, explorer, rollups, alerts, …) whose
    SQL reads a project table, or a table/subquery given as ``{variable}``, names project_id."""
    tables = "|".join(map(re.escape, TABLES))
    reads = re.compile(rf"\b(?:FROM|JOIN)\s+(?:\w+\.)?(?:{tables})\b|\b(?:FROM|JOIN)\s+\{{")
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if not f.startswith(("tests/", "bench/", "store/", "sdk/", "demo/")) and "migrations" not in f]
    checked, unscoped = 0, []
    for name in files:
        source = (ROOT / name).read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_source_segment(source, node) or ""
                if reads.search(text):
                    checked += 1
                    if "project_id" not in text and (name, node.name) not in BUILT_BY_CALLER | WHOLE_STORE:
                        unscoped.append(f"{name}:{node.lineno} {node.name}")
    assert checked > 20, checked
    assert not unscoped, unscoped
