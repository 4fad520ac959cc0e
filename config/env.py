"""Read tracedash's configuration from the environment, in one place.

Every variable the application reads is listed in ``VARIABLES`` (the docker-compose test checks
that each one is wired). An unset variable means the embedded default; a bad value raises
``ConfigError`` naming the variable, so the process fails at start with a message a person can act
on instead of failing later inside a driver.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

VARIABLES: dict[str, str] = {
    "TRACEDASH_DATA_DIR": "directory for embedded data (chdb store, SQLite, secret key); default ./var",
    "TRACEDASH_CLICKHOUSE_URL": "clickhouse://user:pass@host:9000/db for a ClickHouse server; unset: embedded chdb",
    "TRACEDASH_CLICKHOUSE_CLUSTER": "cluster name: migrations run ON CLUSTER with Replicated engines",
    "DATABASE_URL": "postgres://user:pass@host:5432/db for PostgreSQL; unset: SQLite under the data dir",
    "CELERY_BROKER_URL": "redis://host:6379/0 for a real broker; unset: beat schedule runs in-process",
    "TRACEDASH_CHANNEL_LAYER_URL": "redis://host:6379/1 for channels_redis; unset: in-memory layer",
    "TRACEDASH_SECRET_KEY": "Django secret key; unset: generated once and kept in the data dir",
    "TRACEDASH_DEBUG": "1 to enable Django debug pages (never in production)",
    "TRACEDASH_HTTPS": "1 when the dashboard is served over HTTPS: secure cookies and HSTS (ignored with TRACEDASH_DEBUG=1)",
    "TRACEDASH_HSTS_SECONDS": "Strict-Transport-Security max-age under TRACEDASH_HTTPS=1; default 31536000 (a year)",
    "TRACEDASH_PROXY_SSL_HEADER": "header a TLS-terminating proxy sets to https (e.g. X-Forwarded-Proto); unset: not trusted",
    "TRACEDASH_ALLOWED_HOSTS": "comma-separated host names the server answers to",
    "TRACEDASH_RETENTION_DAYS": "days spans and resource samples are kept (ClickHouse TTL); default 30",
    "TRACEDASH_BEAT_SAMPLE_SECONDS": "interval of the in-process host sampler in embedded mode; default 10",
    "TRACEDASH_INGEST_MAX_BODY_MB": "largest ingest request body, before and after gunzip; default 10",
    "TRACEDASH_INGEST_MAX_SPANS": "most spans (or resource samples) in one ingest request; default 10000",
    "TRACEDASH_INGEST_RATE_LIMIT": "spans per second one ingest key may send (bursts of 2 s allowed); 0 = no limit; default 200000",
    "TRACEDASH_INGEST_SPOOL_MAX_MB": "disk the ingest spool may use while ClickHouse is down, then 503; default 1024",
    "TRACEDASH_INGEST_PARSE_PROCESSES": "worker processes that parse native JSON batches for the server (docs/architecture.md); default 0: the server parses them itself",
    "TRACEDASH_INGEST_WRITE_THREADS": "inserts the ingest writer may run at once (the second only for a batch of 2,000+ rows); default 2, 1 where the server runs its beat in-process",
    "TRACEDASH_DEMO": "1 (default) runs the demo workload and LLM simulator inside `make run`; 0 turns it off",
    "TRACEDASH_DEMO_SIMULATOR_PORT": "port of the demo's LLM simulator under `make run`; default 0 (any free port)",
    "TRACEDASH_SLOW_QUERY_MS": "a ClickHouse read slower than this is logged (one line per caller a minute at most); 0 = off; default 1000",
    "TRACEDASH_SLOW_WRITE_MS": "the same for inserts, DDL and merges (OPTIMIZE/ALTER); 0 = off; default 5000",
    "TRACEDASH_ALERTS_EVALUATE_SECONDS": "how often alert rules are evaluated (beat entry alerts-evaluate); default 5",
    "TRACEDASH_SUMMARIZE_SECONDS": "how often new spans are summarised into per-trace rows (beat entry traces-summarize); default 2",
    "TRACEDASH_ROLLUP_SECONDS": "how often the minute/hour/day rollups are updated (beat entry rollups-update); default 10",
    "TRACEDASH_ROLLUP_LATE_SECONDS": "the late-arrival window: minutes this recent are recomputed as a safety net beside the marked ones; default 600",
    "TRACEDASH_ROLLUP_LATE_EVERY_SECONDS": "how often a rollup run re-covers the whole late-arrival window (the marked minutes are recomputed on every run); default 300",
    "TRACEDASH_EMAIL_URL": "smtp://user:pass@host:587 (smtps:// for TLS on connect, ?starttls=1) for alert email; unset: emails are written to the log",
    "TRACEDASH_EMAIL_FROM": "sender address of alert email; default tracedash@localhost",
    "TRACEDASH_PUBLIC_URL": "the dashboard's public base URL, linked from alert notifications; default none",
    "HOST": "address `make run` binds; default 127.0.0.1",
    "PORT": "port `make run` binds; default 8000",
}


class ConfigError(Exception):
    """A configuration variable holds a value tracedash cannot use."""

    def __init__(self, variable: str, message: str):
        self.variable = variable
        super().__init__(f"{variable}: {message}")


@dataclass(frozen=True)
class ClickHouseURL:
    host: str
    port: int
    database: str
    user: str = "default"
    password: str = field(default="", repr=False)
    secure: bool = False
    connect_timeout: float = 5.0
    send_receive_timeout: float = 60.0


@dataclass(frozen=True)
class Env:
    data_dir: Path
    clickhouse: ClickHouseURL | None
    clickhouse_cluster: str | None
    database: dict
    broker_url: str | None
    channel_layer_url: str | None
    secret_key: str = field(repr=False)
    debug: bool
    allowed_hosts: list[str]
    retention_days: int
    beat_sample_seconds: float
    ingest_max_body_bytes: int
    ingest_max_spans: int
    ingest_rate_limit: int
    ingest_spool_max_bytes: int
    demo: bool
    host: str
    port: int
    alerts_evaluate_seconds: float
    summarize_seconds: float
    summary_engine: str
    rollup_seconds: float
    rollup_late_seconds: int
    rollup_late_every_seconds: int
    email: dict
    email_from: str
    public_url: str
    https: bool = False
    hsts_seconds: int = 31_536_000
    proxy_ssl_header: str | None = None
    beat_in_process: bool = True
    release_memory_seconds: int = 5  # embedded store: return freed memory this often (0: never)
    background_nice: int = 10  # Linux: the embedded beat's threads and the embedded store's merges run this much nicer
    demo_simulator_port: int = 0
    slow_query_ms: int = 1000
    slow_write_ms: int = 5000
    key_cache_ms: int = 500
    ingest_write_threads_set: int = 0  # 0: chosen by ingest_write_threads
    ingest_parse_processes: int = 0  # worker processes parsing native JSON batches (0: in process)
    ingest_journal_set: str = "auto"  # auto|on|off: chosen by ingest_journal
    scrape_targets: tuple[str, ...] = ()  # inference engines' /metrics the embedded server scrapes

    @property
    def embedded_store(self) -> bool:
        return self.clickhouse is None

    @property
    def embedded_beat(self) -> bool:
        return self.broker_url is None and self.beat_in_process

    @property
    def ingest_write_threads(self) -> int:
        """Inserts the ingest writer may run at once. A second one uses cores that would otherwise
        wait on the first; a server running its beat in-process already fills them with the beat's
        work, and there a second insert only made smaller parts (docs/BENCHMARKS.md, "two inserts
        at once"), so it runs one."""
        return self.ingest_write_threads_set or (1 if self.embedded_beat else 2)

    @property
    def ingest_journal(self) -> bool:
        """Whether the ingest writer acknowledges concurrent span batches from its fsync'd journal
        and inserts them together a moment later (``ingest.writer``). Auto: with the embedded store,
        where it was measured (docs/BENCHMARKS.md, "the journal")."""
        return self.ingest_journal_set == "on" or (self.ingest_journal_set == "auto" and self.embedded_store)


def _get(environ, name: str) -> str | None:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _positive_int(environ, name: str, default: int, *, minimum: int = 1, maximum: int = 10**9) -> int:
    raw = _get(environ, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"expected a whole number, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(name, f"expected a number from {minimum} to {maximum}, got {value}")
    return value


def _choice(environ, name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first is the default)."""
    raw = (_get(environ, name) or choices[0]).lower()
    if raw not in choices:
        raise ConfigError(name, f"expected one of {', '.join(choices)}, got {raw!r}")
    return raw


def _flag(environ, name: str, default: str = "0") -> bool:
    raw = (_get(environ, name) or default).lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, f"expected 1/0, true/false, yes/no or on/off, got {raw!r}")


def parse_clickhouse_url(raw: str, name: str = "TRACEDASH_CLICKHOUSE_URL") -> ClickHouseURL:
    parts = urlsplit(raw)
    if parts.scheme not in ("clickhouse", "clickhouses"):
        raise ConfigError(
            name, f"expected clickhouse://user:pass@host:9000/db (or clickhouses:// for TLS), got scheme {parts.scheme!r}"
        )
    if not parts.hostname:
        raise ConfigError(name, "the URL names no host")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(name, "the port is not a number from 1 to 65535") from None
    secure = parts.scheme == "clickhouses"
    database = unquote(parts.path.lstrip("/")) or "tracedash"
    if not database.replace("_", "").isalnum():
        raise ConfigError(name, f"database name {database!r} may hold only letters, digits and _")
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    timeouts = {}
    for option in ("connect_timeout", "send_receive_timeout"):
        if option in options:
            try:
                timeouts[option] = float(options.pop(option))
            except ValueError:
                raise ConfigError(name, f"{option} must be a number of seconds") from None
            if timeouts[option] <= 0:
                raise ConfigError(name, f"{option} must be positive")
    if options:
        raise ConfigError(name, f"unknown option(s) {', '.join(sorted(options))}; known: connect_timeout, send_receive_timeout")
    return ClickHouseURL(
        host=parts.hostname,
        port=port or (9440 if secure else 9000),
        database=database,
        user=unquote(parts.username) if parts.username else "default",
        password=unquote(parts.password) if parts.password else "",
        secure=secure,
        **timeouts,
    )


def parse_database_url(raw: str | None, data_dir: Path, name: str = "DATABASE_URL") -> dict:
    if raw is None:
        return _sqlite(str(data_dir / "tracedash.sqlite3"))
    parts = urlsplit(raw)
    if parts.scheme in ("postgres", "postgresql"):
        if not parts.hostname:
            raise ConfigError(name, "the URL names no host")
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ConfigError(name, "the URL names no database (postgres://user:pass@host:5432/DBNAME)")
        try:
            port = parts.port or 5432
        except ValueError:
            raise ConfigError(name, "the port is not a number from 1 to 65535") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": database,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname,
            "PORT": str(port),
            # No persistent connections under ASGI (see _sqlite); put PgBouncer in front at scale.
            "CONN_MAX_AGE": 0,
            "OPTIONS": {"connect_timeout": 5},
        }
    if parts.scheme == "sqlite":
        path = raw[len("sqlite:///"):] if raw.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(name, "expected sqlite:///path/to/file.sqlite3")
        return _sqlite(path)
    raise ConfigError(name, f"expected postgres://… or sqlite:///…, got scheme {parts.scheme!r}")


def _sqlite(path: str) -> dict:
    # WAL lets readers (pages) run beside the one writer. No persistent connections: under ASGI
    # each request's synchronous code runs in its own thread, which would leave one open each.
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": path,
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", "timeout": 20}}


def _redis_url(environ, name: str, *, allow_amqp: bool = False) -> str | None:
    raw = _get(environ, name)
    if raw is None:
        return None
    schemes = ("redis", "rediss") + (("amqp", "amqps", "pyamqp") if allow_amqp else ())
    parts = urlsplit(raw)
    if parts.scheme not in schemes:
        raise ConfigError(name, f"expected a URL with scheme {' or '.join(s + '://' for s in schemes)}, got {raw!r}")
    if not parts.hostname:
        raise ConfigError(name, "the URL names no host")
    try:
        parts.port
    except ValueError:
        raise ConfigError(name, "the port is not a number from 1 to 65535") from None
    return raw


def parse_email_url(raw: str | None, name: str = "TRACEDASH_EMAIL_URL") -> dict:
    """Django EMAIL_* settings: SMTP from ``smtp://`` / ``smtps://``; unset: the console backend."""
    if raw is None:
        return {"EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}
    parts = urlsplit(raw)
    if parts.scheme not in ("smtp", "smtps"):
        raise ConfigError(name, f"expected smtp://user:pass@host:587 or smtps://…, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ConfigError(name, "the URL names no host")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(name, "the port is not a number from 1 to 65535") from None
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(options) - {"starttls"}
    if unknown:
        raise ConfigError(name, f"unknown option(s) {', '.join(sorted(unknown))}; known: starttls")
    ssl = parts.scheme == "smtps"
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": parts.hostname,
        "EMAIL_PORT": port or (465 if ssl else 587),
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_SSL": ssl,
        "EMAIL_USE_TLS": not ssl and options.get("starttls", "1") in ("1", "true", "yes", "on"),
        "EMAIL_TIMEOUT": 10,
    }


def _public_url(environ) -> str:
    raw = _get(environ, "TRACEDASH_PUBLIC_URL")
    if raw is None:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("TRACEDASH_PUBLIC_URL", f"expected http(s)://host[:port][/path], got {raw!r}")
    return raw.rstrip("/")


def _proxy_ssl_header(environ) -> str | None:
    raw = _get(environ, "TRACEDASH_PROXY_SSL_HEADER")
    if raw is None:
        return None
    if not raw.replace("-", "").replace("_", "").isalnum() or not raw.isascii():
        raise ConfigError("TRACEDASH_PROXY_SSL_HEADER", f"expected a header name such as X-Forwarded-Proto, got {raw!r}")
    return raw


def security_settings(loaded: Env) -> dict:
    """Django's cookie and transport-security settings for ``loaded``. Under TRACEDASH_HTTPS=1
    (and not DEBUG) cookies are sent over HTTPS only and HSTS is on; the proxy's scheme header is
    trusted only when TRACEDASH_PROXY_SSL_HEADER names it (trusting it without a proxy that
    overwrites it would let any client claim HTTPS)."""
    https = loaded.https and not loaded.debug
    header = loaded.proxy_ssl_header
    return {
        "SESSION_COOKIE_SECURE": https,
        "CSRF_COOKIE_SECURE": https,
        "SECURE_HSTS_SECONDS": loaded.hsts_seconds if https else 0,
        "SECURE_PROXY_SSL_HEADER": ("HTTP_" + header.upper().replace("-", "_"), "https") if header else None,
        "SECURE_REFERRER_POLICY": "same-origin",
        "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "CSRF_COOKIE_HTTPONLY": True,
        "X_FRAME_OPTIONS": "DENY",
    }


def _secret_key(environ, data_dir: Path) -> str:
    raw = _get(environ, "TRACEDASH_SECRET_KEY")
    if raw is not None:
        if len(raw) < 32:
            raise ConfigError("TRACEDASH_SECRET_KEY", "must be at least 32 characters")
        return raw
    # Embedded default: one random key per data dir, so sessions survive restarts.
    path = data_dir / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(48)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


def load(environ=None) -> Env:
    environ = os.environ if environ is None else environ
    data_dir = Path(_get(environ, "TRACEDASH_DATA_DIR") or "./var").expanduser().resolve()
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError("TRACEDASH_DATA_DIR", f"{data_dir} exists and is not a directory")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("TRACEDASH_DATA_DIR", f"cannot create {data_dir}: {exc.strerror}") from None
    raw_ch = _get(environ, "TRACEDASH_CLICKHOUSE_URL")
    cluster = _get(environ, "TRACEDASH_CLICKHOUSE_CLUSTER")
    if cluster is not None and not cluster.replace("_", "").replace("-", "").isalnum():
        raise ConfigError("TRACEDASH_CLICKHOUSE_CLUSTER", f"cluster name {cluster!r} may hold only letters, digits, - and _")
    host = _get(environ, "HOST") or "127.0.0.1"
    allowed = _get(environ, "TRACEDASH_ALLOWED_HOSTS")
    allowed_hosts = [h.strip() for h in allowed.split(",") if h.strip()] if allowed else ["127.0.0.1", "localhost", "[::1]"]
    if not allowed and host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        allowed_hosts.append(host)
    return Env(
        data_dir=data_dir,
        clickhouse=parse_clickhouse_url(raw_ch) if raw_ch else None,
        clickhouse_cluster=cluster,
        database=parse_database_url(_get(environ, "DATABASE_URL"), data_dir),
        broker_url=_redis_url(environ, "CELERY_BROKER_URL", allow_amqp=True),
        channel_layer_url=_redis_url(environ, "TRACEDASH_CHANNEL_LAYER_URL"),
        secret_key=_secret_key(environ, data_dir),
        debug=_flag(environ, "TRACEDASH_DEBUG"),
        allowed_hosts=allowed_hosts,
        retention_days=_positive_int(environ, "TRACEDASH_RETENTION_DAYS", 30, maximum=36500),
        beat_sample_seconds=float(_positive_int(environ, "TRACEDASH_BEAT_SAMPLE_SECONDS", 10, maximum=3600)),
        ingest_max_body_bytes=_positive_int(environ, "TRACEDASH_INGEST_MAX_BODY_MB", 10, maximum=1024) * 1024 * 1024,
        ingest_max_spans=_positive_int(environ, "TRACEDASH_INGEST_MAX_SPANS", 10_000, maximum=1_000_000),
        ingest_rate_limit=_positive_int(environ, "TRACEDASH_INGEST_RATE_LIMIT", 200_000, minimum=0),
        ingest_spool_max_bytes=_positive_int(environ, "TRACEDASH_INGEST_SPOOL_MAX_MB", 1024, maximum=10**7) * 1024 * 1024,
        ingest_write_threads_set=_positive_int(environ, "TRACEDASH_INGEST_WRITE_THREADS", 0, minimum=0, maximum=8),
        ingest_parse_processes=_positive_int(environ, "TRACEDASH_INGEST_PARSE_PROCESSES", 0, minimum=0, maximum=64),
        ingest_journal_set=_choice(environ, "TRACEDASH_INGEST_JOURNAL", ("auto", "on", "off")),
        demo=_flag(environ, "TRACEDASH_DEMO", "1"),
        demo_simulator_port=_positive_int(environ, "TRACEDASH_DEMO_SIMULATOR_PORT", 0, minimum=0, maximum=65535),
        slow_query_ms=_positive_int(environ, "TRACEDASH_SLOW_QUERY_MS", 1000, minimum=0, maximum=86_400_000),
        slow_write_ms=_positive_int(environ, "TRACEDASH_SLOW_WRITE_MS", 5000, minimum=0, maximum=86_400_000),
        key_cache_ms=_positive_int(environ, "TRACEDASH_KEY_CACHE_MS", 500, minimum=0, maximum=60_000),
        beat_in_process=_flag(environ, "TRACEDASH_EMBEDDED_BEAT", "1"),
        release_memory_seconds=_positive_int(environ, "TRACEDASH_RELEASE_MEMORY_SECONDS", 5, minimum=0, maximum=3600),
        background_nice=_positive_int(environ, "TRACEDASH_BACKGROUND_NICE", 10, minimum=0, maximum=19),
        host=host,
        port=_positive_int(environ, "PORT", 8000, maximum=65535),
        alerts_evaluate_seconds=float(_positive_int(environ, "TRACEDASH_ALERTS_EVALUATE_SECONDS", 5, maximum=3600)),
        summarize_seconds=float(_positive_int(environ, "TRACEDASH_SUMMARIZE_SECONDS", 2, maximum=3600)),
        summary_engine=_choice(environ, "TRACEDASH_SUMMARY_ENGINE", ("auto", "arrays", "sql")),
        rollup_seconds=float(_positive_int(environ, "TRACEDASH_ROLLUP_SECONDS", 10, maximum=3600)),
        rollup_late_seconds=_positive_int(environ, "TRACEDASH_ROLLUP_LATE_SECONDS", 600, minimum=0, maximum=7 * 86400),
        rollup_late_every_seconds=_positive_int(environ, "TRACEDASH_ROLLUP_LATE_EVERY_SECONDS", 300, minimum=0,
                                                maximum=86400),
        email=parse_email_url(_get(environ, "TRACEDASH_EMAIL_URL")),
        email_from=_get(environ, "TRACEDASH_EMAIL_FROM") or "tracedash@localhost",
        public_url=_public_url(environ),
        https=_flag(environ, "TRACEDASH_HTTPS"),
        hsts_seconds=_positive_int(environ, "TRACEDASH_HSTS_SECONDS", 31_536_000, minimum=0, maximum=10 * 31_536_000),
        proxy_ssl_header=_proxy_ssl_header(environ),
        scrape_targets=_scrape_targets(environ),
    )


def _scrape_targets(environ) -> tuple[str, ...]:
    """``TRACEDASH_SCRAPE``: inference engines' Prometheus endpoints, comma-separated, each
    ``[ENGINE=]URL`` (``vllm=http://gpu-1:8000/metrics``), as the agent's ``--scrape`` takes them."""
    from agent.engines import parse_target

    raw = _get(environ, "TRACEDASH_SCRAPE") or ""
    targets = []
    for part in raw.split(","):
        if part.strip():
            try:
                parse_target(part)
            except ValueError as exc:
                raise ConfigError("TRACEDASH_SCRAPE", str(exc)) from None
            targets.append(part.strip())
    return tuple(targets)
