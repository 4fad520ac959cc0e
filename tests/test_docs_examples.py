"""Every request example in README.md and docs/*.md runs verbatim against a live server and is
answered 2xx, so a documented example can never be refused again.

Examples are the fenced code blocks: each ``curl`` command in them (run with curl itself: only the
server URL ``http://127.0.0.1:8000`` and ``$TRACEDASH_API_KEY`` are substituted), each ``json``
block that is a request body (``{"spans": …}``, ``{"samples": …}``, ``{"resourceSpans": …}``,
``{"resourceMetrics": …}``, POSTed to its endpoint), and the SDK quick starts (python blocks that
begin ``import tracedash_sdk as td``, run with ``TRACEDASH_ENDPOINT``/``TRACEDASH_API_KEY`` set and
the app's own function stubbed). ``EXPECTED`` counts them per file: a new example changes the
count, so it cannot be skipped silently; a request example written anywhere else (inline code in
prose, an ``http`` block, a curl that does not start its line) fails the extraction check.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
SERVER = "http://127.0.0.1:8000"
KEY_VARIABLES = ("${TRACEDASH_API_KEY}", "$TRACEDASH_API_KEY")

# (curl commands, json request bodies, SDK quick starts) per file; files not listed have none.
EXPECTED = {
    "README.md": (6, 0, 1),
    "docs/api.md": (2, 0, 0),
    "docs/engines.md": (1, 0, 0),
    "docs/grouping.md": (1, 0, 0),
    "docs/otlp.md": (3, 0, 0),
    "docs/sdk.md": (0, 0, 1),
    "docs/scores.md": (1, 0, 1),
}
JSON_ENDPOINTS = {"spans": "/api/v1/traces", "samples": "/api/v1/resources", "resourceSpans": "/v1/traces",
                  "resourceMetrics": "/v1/metrics"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INLINE_REQUEST = re.compile(r"`(curl |\{\s*\"(?:spans|samples|resourceSpans|resourceMetrics)\")")


class Example:
    def __init__(self, path: str, line: int, kind: str, text: str):
        self.path, self.line, self.kind, self.text = path, line, kind, text

    def __repr__(self):
        return f"{self.path}:{self.line} ({self.kind})"


def _curl_commands(body: str) -> list[tuple[int, str]]:
    """(line offset, command) of each curl command; a command runs on while a quote is open or a
    line ends with a backslash."""
    lines, out, i = body.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("curl "):
            i += 1
            continue
        start, command = i, lines[i]
        while i + 1 < len(lines):
            try:
                shlex.split(command, comments=True)
                if not command.rstrip().endswith("\\"):
                    break
            except ValueError:  # an open quote: the command goes on
                pass
            i += 1
            command += "\n" + lines[i]
        out.append((start, command))
        i += 1
    return out


def extract(path: str) -> list[Example]:
    text = (ROOT / path).read_text()
    examples = []
    for match in FENCE.finditer(text):
        lang, body = match.group(1).strip().lower(), match.group(2)
        line = text.count("\n", 0, match.start()) + 2  # the block's first line
        if lang == "http":
            pytest.fail(f"{path}:{line}: write request examples as curl commands (http blocks are not run)")
        for offset, command in _curl_commands(body):
            examples.append(Example(path, line + offset, "curl", command))
        if lang == "json":
            try:
                document = json.loads(body)
            except ValueError:
                continue
            if isinstance(document, dict) and set(document) & set(JSON_ENDPOINTS):
                examples.append(Example(path, line, "json", body))
        if lang == "python" and body.startswith("import tracedash_sdk as td"):
            examples.append(Example(path, line, "sdk", body))
    return examples


def _code_blocks_removed(text: str) -> str:
    return FENCE.sub("", text)


def test_the_extraction_finds_every_request_example():
    found = {}
    for path in DOC_FILES:
        examples = extract(path)
        counts = tuple(sum(1 for e in examples if e.kind == kind) for kind in ("curl", "json", "sdk"))
        if counts != (0, 0, 0):
            found[path] = counts
        text = (ROOT / path).read_text()
        # Every curl in a code block starts a command the extraction took.
        in_blocks = sum(len(re.findall(r"\bcurl\b", m.group(2))) for m in FENCE.finditer(text))
        assert in_blocks == counts[0], f"{path}: a curl in a code block that is not a command of its own line"
        # A request written in prose (inline code) would never be run: it belongs in a code block.
        inline = INLINE_REQUEST.findall(_code_blocks_removed(text))
        assert not inline, f"{path}: request example in inline code ({inline}); put it in a code block"
    assert found == EXPECTED


def _run_curl(example: Example, url: str, key: str, tmp_path: Path) -> tuple[int, str]:
    text = example.text.replace(SERVER, url)
    for variable in KEY_VARIABLES:
        text = text.replace(variable, key)
    argv = shlex.split(text.replace("\\\n", ""), comments=True)  # the shell's line continuation
    assert argv[0] == "curl", example
    body = tmp_path / "answer"
    done = subprocess.run([*argv, "-sS", "-o", str(body), "-w", "%{http_code}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{example}: curl failed: {done.stderr}"
    return int(done.stdout.strip()[-3:]), body.read_text(errors="replace")[:2000]


def _post_json(example: Example, url: str, key: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    document = json.loads(example.text)
    endpoint = JSON_ENDPOINTS[next(k for k in document if k in JSON_ENDPOINTS)]
    request = urllib.request.Request(url + endpoint, data=example.text.encode(), method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode(errors="replace")[:2000]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:2000]


def _trace_ids(project_id: int) -> set[str]:
    from store import get_store

    rows = get_store().query("SELECT DISTINCT trace_id FROM spans WHERE project_id = {p:UInt64}",
                             {"p": project_id}, tag="tests.docs_examples").dicts()
    return {row["trace_id"] for row in rows}


def _run_sdk(example: Example, url: str, key: str, project_id: int, monkeypatch) -> tuple[int, str]:
    monkeypatch.syspath_prepend(str(ROOT / "sdk"))
    monkeypatch.setenv("TRACEDASH_ENDPOINT", url)
    monkeypatch.setenv("TRACEDASH_API_KEY", key)
    before = _trace_ids(project_id)
    # The app's own code, which the snippet calls: stubbed.
    namespace = {"call_model": lambda *args, **kwargs: "an answer", "prompt": "a question"}
    exec(compile(example.text, str(example), "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["tracer"].flush(timeout=60), f"{example}: the SDK could not send its spans"
    new = wait_until(lambda: _trace_ids(project_id) - before, message=f"{example}: the snippet's trace stored")
    return 200, f"stored trace {sorted(new)}"


def _refused_items(answer: str) -> bool:
    """A 2xx answer that still refused part of the example (native ``rejected``, OTLP ``partialSuccess``)."""
    try:
        document = json.loads(answer)
    except ValueError:
        return False
    if not isinstance(document, dict):
        return False
    partial = document.get("partialSuccess") or {}
    rejected_counts = ("rejectedSpans", "rejectedDataPoints", "rejectedLogRecords")
    return bool(document.get("rejected")) or any(int(partial.get(k, 0) or 0) for k in rejected_counts)


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_every_documented_request_example_is_answered_2xx(asgi_server, project_with_key, tmp_path, monkeypatch):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the examples are run with curl itself)")
    project, key = project_with_key()
    failures = []
    for path in DOC_FILES:
        for example in extract(path):  # in document order: a GET of a trace follows its POST
            if example.kind == "curl":
                status, answer = _run_curl(example, asgi_server.url, key, tmp_path)
            elif example.kind == "json":
                status, answer = _post_json(example, asgi_server.url, key)
            else:
                with monkeypatch.context() as patch:
                    status, answer = _run_sdk(example, asgi_server.url, key, project.pk, patch)
            if not 200 <= status < 300:
                failures.append(f"{example}: {status} {answer}")
            elif _refused_items(answer):
                failures.append(f"{example}: part of the example was rejected: {answer}")
    assert not failures, "\n".join(failures)
