"""``python -m agent`` / ``manage.py run_agent`` / ``agent.check_gpu``: arguments, the loop, signals, and
the promise that the agent imports nothing from Django or the server."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from agent import check_gpu, cli
from tests.conftest import wait_until
from tests.fake_nvml import GiB, FakeGpu, FakeNvml
from tests.test_agent_sender import Recorder

REPO = Path(__file__).resolve().parent.parent
AGENT_LOG = "tracedash.agent"
SERVER_PACKAGES = {"django", "config", "store", "ingest", "projects", "dashboard", "alerts", "celery", "channels",
                   "msgspec", "tests"}


@pytest.fixture
def server():
    recorder = Recorder()
    yield recorder
    recorder.close()


@pytest.fixture
def fake(monkeypatch):
    nvml = FakeNvml([FakeGpu("GPU-1", "Fake H100", memory_used=60 * GiB, memory_total=80 * GiB, compute=[(os.getpid(), GiB)]),
                     FakeGpu("GPU-2", "Fake H100", memory_used=GiB, memory_total=80 * GiB)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_the_agent_imports_nothing_from_django_or_the_server(tmp_path):
    """A GPU host has only the agent/ folder, psutil and nvidia-ml-py: copy the folder alone and put
    a django that cannot be imported first on the path."""
    fake_django = tmp_path / "fakes" / "django"
    fake_django.mkdir(parents=True)
    (fake_django / "__init__.py").write_text('raise ImportError("django must not be imported by the agent")\n')
    host = tmp_path / "gpu-host"
    shutil.copytree(REPO / "agent", host / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fakes")}
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=host, env=env, capture_output=True, text=True, timeout=60)

    assert run("-c", "import django").returncode != 0  # the fake really stands in the way
    probe = run("-c", "import sys, agent, agent.cli, agent.sender, agent.sampler, agent.check_gpu, agent.__main__; "
                      "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    assert probe.returncode == 0, probe.stderr
    loaded = set(probe.stdout.split())
    assert not loaded & SERVER_PACKAGES, loaded & SERVER_PACKAGES
    assert "agent" in loaded and "psutil" in loaded
    assert run("-c", "import agent.cli").returncode == 0
    helped = run("-m", "agent", "--help")
    assert helped.returncode == 0 and "--endpoint" in helped.stdout
    checked = run("-m", "agent.check_gpu")  # exit 0 with a clear line without NVML, or a checked real sample
    assert checked.returncode == 0, checked.stderr
    assert "check_gpu:" in checked.stderr


def test_arguments_come_from_the_command_line_then_the_environment():
    env = {"TRACEDASH_ENDPOINT": "http://td:8000", "TRACEDASH_API_KEY": "env-key", "TRACEDASH_AGENT_INTERVAL": "2.5"}
    args = cli.parse_args([], env)
    assert (args.endpoint, args.api_key, args.interval, args.host, args.once) == ("http://td:8000", "env-key", 2.5, None, False)
    args = cli.parse_args(["--endpoint", "https://x", "--api-key", "k", "--interval", "10", "--host", "gpu-7", "--once"], env)
    assert (args.endpoint, args.api_key, args.interval, args.host, args.once) == ("https://x", "k", 10.0, "gpu-7", True)
    assert cli.parse_args(["--endpoint", "http://td", "--api-key", "k"], {}).interval == cli.DEFAULT_INTERVAL


@pytest.mark.parametrize("argv, env, message", [
    ([], {"TRACEDASH_API_KEY": "k"}, "no server"),
    (["--endpoint", "http://td"], {}, "no ingest key"),
    (["--endpoint", "td:8000", "--api-key", "k"], {}, "http:// or https://"),
    (["--endpoint", "http://td", "--api-key", "k", "--interval", "0"], {}, "--interval"),
    (["--endpoint", "http://td", "--api-key", "k"], {"TRACEDASH_AGENT_INTERVAL": "often"}, "TRACEDASH_AGENT_INTERVAL"),
])
def test_bad_arguments_stop_with_a_message(capsys, argv, env, message):
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(argv, env)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_once_samples_sends_and_exits_0(fake, server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    assert cli.main(["--endpoint", server.url, "--api-key", "k1", "--once", "--host", "gpu-host-9"], environ={}) == 0
    [request] = server.requests
    assert request["headers"]["Authorization"] == "Bearer k1"
    samples = request["samples"]
    assert [(s["host"], s["gpu_index"]) for s in samples] == [("gpu-host-9", -1), ("gpu-host-9", 0), ("gpu-host-9", 1)]
    assert samples[1]["gpu_memory_used"] == 60 * GiB and samples[1]["processes"][0]["pid"] == os.getpid()
    assert 0 <= samples[0]["cpu_percent"] <= 100
    messages = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG]
    assert any("GPUs=2" in m for m in messages) and any(m.startswith("stopped; agent status:") and "sent=3" in m for m in messages)
    assert fake.calls[-1] == "nvmlShutdown"


def test_once_exits_1_when_the_server_cannot_take_the_samples(fake, server):
    server.script = [(503, {"Retry-After": "1"}, {"error": {"code": "overloaded", "message": "busy", "details": []}})]
    assert cli.main(["--endpoint", server.url, "--api-key", "k", "--once"], environ={}) == 1
    assert len(server.requests) == 1  # one try, no second one at exit


def test_the_loop_samples_every_interval_and_stops_with_a_final_flush(fake, server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    stop = threading.Event()
    codes = []
    thread = threading.Thread(target=lambda: codes.append(cli.main(
        ["--endpoint", server.url, "--api-key", "k", "--interval", "0.1", "--status-every", "0.2", "--host", "loop"],
        stop=stop, environ={})))
    thread.start()
    try:
        wait_until(lambda: len(server.requests) >= 4, timeout=10, message="four posts")
        server.script = [(503, {}, {"error": {"code": "store_unavailable", "message": "down", "details": []}})] * 1000
        wait_until(lambda: "HTTP 503" in (cli_stats(caplog) or ""), timeout=10, message="an outage")
        server.script = []
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive() and codes == [0]
    times = [s["time"] for s in server.received if s["gpu_index"] == -1]
    assert times == sorted(set(times))  # every tick sent once, in order, the outage's samples too
    messages = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG]
    assert any(m.startswith("agent status: host=loop gpus=2") for m in messages)
    final = [m for m in messages if m.startswith("stopped;")]
    assert len(final) == 1 and "buffered=0" in final[0]


def test_a_hanging_server_does_not_delay_sampling(fake):
    from agent.sampler import ResourceSampler
    from agent.sender import ResourceSender

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # connections wait in the backlog: no answer, ever
    agent = cli.Agent(ResourceSampler(host="h", min_cpu_window=0.01),
                      ResourceSender(f"http://127.0.0.1:{listener.getsockname()[1]}", "k", timeout=6),
                      interval=0.1, status_every=60)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    try:
        thread.start()
        # five samples (0.5 s of sampling) before the first request, hanging, has ended (its 6 s timeout):
        # had the hang held the loop, no second sample could be taken before a request ended. Keyed on
        # that order, not on the clock; the ceiling only bounds a very busy machine.
        def request_ended():
            stats = agent.sender.stats
            return stats["sent"] + stats["failed"] + stats["retries"] > 0
        wait_until(lambda: agent.samples_taken >= 5 or request_ended(), timeout=60, message="five samples or a request")
        assert agent.samples_taken >= 5 and not request_ended(), "sampling waited for a hanging request"
    finally:
        stop.set()
        thread.join(timeout=40)
        listener.close()
    assert not thread.is_alive()
    assert agent.sender.stats["sent"] == 0 and agent.sender.stats["buffered"] >= 5 * 3


def cli_stats(caplog):
    return " ".join(r.getMessage() for r in caplog.records if r.name == AGENT_LOG)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_agent_cleanly(server, signum):
    env = {**os.environ, "TRACEDASH_API_KEY": "k", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "agent", "--endpoint", server.url, "--interval", "0.2",
                                "--host", "signal-test"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(server.requests) >= 2 or process.poll() is not None, timeout=30, message="the agent posting")
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert f"{signal.Signals(signum).name} received: stopping after a final flush" in stderr
    assert "stopped; agent status: host=signal-test" in stderr and "buffered=0" in stderr
    assert "Traceback" not in stderr


@pytest.mark.django_db
def test_run_agent_command_wraps_the_same_loop(fake, server, monkeypatch):
    monkeypatch.delenv("TRACEDASH_ENDPOINT", raising=False)
    call_command("run_agent", "--once", "--endpoint", server.url, "--api-key", "cmd-key", "--host", "cmd-host")
    [request] = server.requests
    assert request["headers"]["Authorization"] == "Bearer cmd-key"
    assert {s["host"] for s in request["samples"]} == {"cmd-host"} and len(request["samples"]) == 3


def test_run_agent_command_needs_a_key_and_defaults_to_this_server(monkeypatch):
    from agent.management.commands.run_agent import default_endpoint

    monkeypatch.delenv("TRACEDASH_API_KEY", raising=False)
    with pytest.raises(CommandError, match="TRACEDASH_API_KEY"):
        call_command("run_agent", "--once")
    host = settings.ENV.host if settings.ENV.host not in ("0.0.0.0", "::") else "127.0.0.1"
    assert default_endpoint() == f"http://{host}:{settings.ENV.port}"


def test_run_agent_command_fails_when_the_server_is_down(fake, server):
    server.script = [(503, {}, {"error": {"code": "x", "message": "down", "details": []}})]
    with pytest.raises(CommandError, match="did not take every sample"):
        call_command("run_agent", "--once", "--endpoint", server.url, "--api-key", "k", "--host", "h")


def test_check_gpu_prints_a_checked_sample(fake, capsys):
    assert check_gpu.main([]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert [r["gpu_index"] for r in printed["rows"]] == [-1, 0, 1]
    assert printed["payload"]["samples"][1]["gpu_memory_used"] == 60 * GiB
    assert "check_gpu: OK: 2 GPU(s)" in err and "75.0 % memory" in err


def test_check_gpu_without_nvml_exits_0_with_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert check_gpu.main([]) == 0
    assert "NVML is not available" in capsys.readouterr().err
    assert check_gpu.main(["--require-gpu"]) == 1


def test_check_gpu_finds_broken_invariants():
    base = {"gpu_index": 0, "gpu_uuid": "GPU-1", "gpu_name": "x", "gpu_memory_used": 9, "gpu_memory_total": 8,
            "gpu_utilization": 101.0, "gpu_temperature": 50.0, "gpu_power_watts": 100.0,
            "process_pids": [1, 1], "process_gpu_memory": [1, 1]}
    host = {"gpu_index": -1, "cpu_percent": 5.0, "memory_used": 1, "memory_total": 2}
    problems = check_gpu.check([host, base])
    assert any("memory used 9" in p for p in problems) and any("utilisation 101" in p for p in problems)
    assert any("listed twice" in p for p in problems)
    assert check_gpu.check([host, {**base, "gpu_memory_used": 8, "gpu_utilization": 100.0, "process_pids": [1, 2]}]) == []

