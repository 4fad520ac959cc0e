"""``manage.py demo --traces N`` sends N traces through a running server's ingestion API."""

import subprocess
import sys

from tests.test_serve import ROOT, Server, _free_port


def test_demo_command_sends_traces_through_the_api(tmp_path):
    server = Server(tmp_path / "var", _free_port())
    server.env["TRACEDASH_DEMO"] = "0"  # only the command's traces
    server.start()
    try:
        done = subprocess.run([sys.executable, "manage.py", "demo", "--traces", "12", "--fast", "--concurrency", "3"],
                              cwd=ROOT, env=server.env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "Sent 12 traces" in done.stdout
        assert "12/12 traces" in done.stderr  # the progress bar reached the end
    finally:
        assert server.interrupt() == 0
    query = "SELECT uniqExact(trace_id), countIf(name = 'POST /v1/chat') FROM spans"
    code = f"import django; django.setup(); from store import get_store; print(get_store().query({query!r}, tag='tests.demo').rows[0])"
    counted = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                             env={**server.env, "DJANGO_SETTINGS_MODULE": "config.settings"},
                             capture_output=True, text=True, timeout=120)
    assert counted.stdout.strip().splitlines()[-1] == "(12, 12)", counted.stderr
