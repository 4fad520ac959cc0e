"""A real ``clickhouse-server`` process of the test's own, for driver-level tests.

``ClickHouseServer(root)`` writes its own config under ``root`` (free TCP port on 127.0.0.1, its
own data directory, one user with a password, logs beside them) and runs the binary found on PATH
(Debian's ``clickhouse-server`` package: ``apt-get install -y clickhouse-server``); never the
system service, whose config and data it does not touch. ``start()`` waits until the server
answers a query over the native protocol (a ceiling, not an expected duration); ``stop()`` sends
SIGTERM and waits; ``restart()`` keeps the port and the data.

``server_binary()`` skips the calling test when the binary is missing, naming the install
command, and fails it instead under ``TRACEDASH_REQUIRE_SERVICES=1`` (set by .ci/run).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from xml.sax.saxutils import escape

INSTALL_HINT = "apt-get install -y clickhouse-server clickhouse-client"
START_CEILING_S = 90.0  # a loaded 2-core machine may be slow; a healthy start takes well under a second
STOP_CEILING_S = 60.0


def server_binary() -> str:
    """The path of ``clickhouse-server``; otherwise skip (or, under CI, fail) the calling test."""
    import pytest

    found = shutil.which("clickhouse-server") or next(
        (p for p in ("/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server") if os.access(p, os.X_OK)), None)
    if found:
        return found
    message = f"no clickhouse-server binary on this machine: install it with `{INSTALL_HINT}`"
    if os.environ.get("TRACEDASH_REQUIRE_SERVICES"):
        pytest.fail(f"{message} (TRACEDASH_REQUIRE_SERVICES is set, so this is a failure, not a skip)")
    pytest.skip(message)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies, even by SIGKILL (Linux),
    so no server outlives an interrupted run."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>{root}/server.log</log>
    <errorlog>{root}/server.err.log</errorlog>
    <console>0</console>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>{port}</tcp_port>
  <path>{root}/data/</path>
  <tmp_path>{root}/data/tmp/</tmp_path>
  <user_files_path>{root}/data/user_files/</user_files_path>
  <format_schema_path>{root}/data/format_schemas/</format_schema_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
"""

_USERS = """<?xml version="1.0"?>
<yandex>
  <!-- poll_interval: an idle connection notices a shutdown within 1 s (10 s by default, which a
       SIGTERM'd server would wait out for every idle client before exiting) -->
  <profiles><default><poll_interval>1</poll_interval></default></profiles>
  <users>
    <{user}>
      <password>{password}</password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </{user}>
  </users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
    <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time></interval></default></quotas>
</yandex>
"""


class ClickHouseServer:
    def __init__(self, root: Path, *, binary: str, user: str = "tracedash"):
        self.root = Path(root)
        self.binary = binary
        self.user = user
        self.password = "pw-" + secrets.token_hex(8)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.xml").write_text(_CONFIG.format(root=escape(str(self.root)), port=self.port))
        (self.root / "users.xml").write_text(_USERS.format(user=user, password=escape(self.password)))

    def url(self, database: str = "tracedash", *, password: str | None = None, user: str | None = None,
            **options) -> str:
        query = "&".join(f"{key}={value}" for key, value in options.items())
        return (f"clickhouse://{user or self.user}:{self.password if password is None else password}"
                f"@{self.host}:{self.port}/{database}{'?' + query if query else ''}")

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        with open(self.root / "stdout.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [self.binary, f"--config-file={self.root / 'config.xml'}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        from clickhouse_driver import Client

        deadline = time.monotonic() + START_CEILING_S
        last_error = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"clickhouse-server exited with {self.process.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            client = Client(host=self.host, port=self.port, user=self.user, password=self.password,
                            connect_timeout=2, send_receive_timeout=10)
            try:
                if client.execute("SELECT 1") == [(1,)]:
                    return
            except Exception as exc:  # noqa: BLE001 - not ready yet: refused, reset, starting up
                last_error = exc
            finally:
                client.disconnect()
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"clickhouse-server did not answer within {START_CEILING_S:.0f} s "
                           f"(last error: {last_error}):\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then wait for the process to exit (SIGKILL only past the ceiling)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_CEILING_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_CEILING_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("stdout.log", "server.err.log"):
            path = self.root / name
            if path.exists():
                out += [f"--- {name}"] + path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)
