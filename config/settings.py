"""Django settings. Every value that differs between deployments comes from ``config.env``."""

import warnings
from pathlib import Path

from config import env as _env

ENV = _env.load()
BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = ENV.data_dir

SECRET_KEY = ENV.secret_key
DEBUG = ENV.debug
ALLOWED_HOSTS = ENV.allowed_hosts

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "store",
    "projects",
    "ingest",
    "analytics",
    "dashboard",
    "alerts",
    "agent",
    "loadtests",
    "server",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.csp.ContentSecurityPolicyMiddleware",  # script-src 'self': no inline scripts (config/csp.py)
    "config.static_middleware.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.current_project",
                "alerts.context_processors.firing_alerts",
            ],
        },
    },
]

DATABASES = {"default": ENV.database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"  # the overview
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "config.static_finders.PlotlyFinder",  # plotly.js from the plotly package itself
]
STATIC_ROOT = BASE_DIR / "staticfiles"  # collectstatic target for images; outside the data volume
# Embedded mode serves static files straight from the app folders (no collectstatic step).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
warnings.filterwarnings("ignore", message=r"No directory at: .*staticfiles")  # expected before collectstatic

# Cookies, HSTS, referrer policy, nosniff, framing: config.env.security_settings (TRACEDASH_HTTPS).
_SECURITY = _env.security_settings(ENV)
SESSION_COOKIE_HTTPONLY = _SECURITY["SESSION_COOKIE_HTTPONLY"]
CSRF_COOKIE_HTTPONLY = _SECURITY["CSRF_COOKIE_HTTPONLY"]
SECURE_CONTENT_TYPE_NOSNIFF = _SECURITY["SECURE_CONTENT_TYPE_NOSNIFF"]
X_FRAME_OPTIONS = _SECURITY["X_FRAME_OPTIONS"]
SECURE_REFERRER_POLICY = _SECURITY["SECURE_REFERRER_POLICY"]
SESSION_COOKIE_SECURE = _SECURITY["SESSION_COOKIE_SECURE"]
CSRF_COOKIE_SECURE = _SECURITY["CSRF_COOKIE_SECURE"]
SECURE_HSTS_SECONDS = _SECURITY["SECURE_HSTS_SECONDS"]
SECURE_PROXY_SSL_HEADER = _SECURITY["SECURE_PROXY_SSL_HEADER"]

# --- ClickHouse (the store) ---------------------------------------------------------------
TRACEDASH_CLICKHOUSE = ENV.clickhouse  # None: embedded chdb under the data dir
TRACEDASH_CLICKHOUSE_PATH = DATA_DIR / "clickhouse"
TRACEDASH_CLICKHOUSE_DATABASE = ENV.clickhouse.database if ENV.clickhouse else "tracedash"
TRACEDASH_CLICKHOUSE_CLUSTER = ENV.clickhouse_cluster
TRACEDASH_RETENTION_DAYS = ENV.retention_days

# --- Celery -------------------------------------------------------------------------------
if ENV.broker_url:
    CELERY_BROKER_URL = ENV.broker_url
    CELERY_RESULT_BACKEND = ENV.broker_url if ENV.broker_url.startswith("redis") else None
    CELERY_TASK_ALWAYS_EAGER = False
else:
    # Embedded: no broker. Tasks run where they are called and the beat schedule runs in a
    # thread of the serving process (server.embedded_beat).
    CELERY_BROKER_URL = "memory://"
    CELERY_RESULT_BACKEND = None
    CELERY_TASK_ALWAYS_EAGER = True
    CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# The one place periodic work is declared; embedded mode runs the same entries in-process.
CELERY_BEAT_SCHEDULE = {}
if ENV.embedded_beat:
    # Production hosts run the agent instead; the embedded server samples its own machine.
    CELERY_BEAT_SCHEDULE["sample-local-host"] = {
        "task": "agent.tasks.sample_local_host",
        "schedule": ENV.beat_sample_seconds,
    }
if ENV.embedded_beat and ENV.embedded_store and ENV.release_memory_seconds:
    # chdb's allocator keeps freed pages until the thread that freed them allocates again (a query
    # that built 250 MiB left the process 250 MiB bigger), and glibc keeps what Python's threads
    # freed inside their arenas; the serving process hands both back every few seconds
    # (store.backends.EmbeddedBackend.release_memory, config.memory.trim).
    CELERY_BEAT_SCHEDULE["store-release-memory"] = {
        "task": "store.tasks.release_memory",
        "schedule": float(ENV.release_memory_seconds),
    }

# Alerts: every rule is evaluated on this interval, by Celery beat or the embedded beat.
CELERY_BEAT_SCHEDULE["alerts-evaluate"] = {
    "task": "alerts.tasks.evaluate",
    "schedule": ENV.alerts_evaluate_seconds,
    "options": {"expires": ENV.alerts_evaluate_seconds},  # a round that waited a whole interval is stale
}

# Per-trace summaries and rollups (server.tasks, named analytics.tasks.*): the summariser fills `traces` from newly
# ingested spans; the rollup task recomputes the minutes it marked and the late-arrival window,
# then their hours and days. Both are idempotent, so an overlapping or repeated run is harmless.
TRACEDASH_SUMMARIZE_SECONDS = ENV.summarize_seconds
# How the figures are computed: "arrays" (one columnar read of the spans, the figures in numpy:
# analytics.summary_arrays) or "sql" (one INSERT … SELECT in ClickHouse: analytics.summary_sql);
# "auto": arrays on the embedded store (Arrow straight from chdb), sql on a server (the native
# driver hands columns over as Python values). The same figures (tests/test_summary_sql.py);
# their cost: bench/summary_engines.py.
TRACEDASH_SUMMARY_ENGINE = ENV.summary_engine
# Re-read before the watermark on a ClickHouse server: inserts still in flight then (the embedded
# store knows its own inserts and re-reads nothing: analytics.summarizer.read_until_ms).
TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 10
TRACEDASH_SUMMARIZE_BATCH_TRACES = 50_000  # traces summarised per INSERT … SELECT (a run has at most MAX_SPANS spans)
TRACEDASH_SUMMARIZE_MAX_SPANS = 200_000  # per project and run; a backlog is worked off over several runs
# A summary batch of at most this many new spans runs on one ClickHouse thread (half the CPU of a
# small batch on many; a larger one, a backlog or a rebuild, uses them all): bench/summary_threads.py
TRACEDASH_SUMMARIZE_ONE_THREAD_SPANS = 50_000
TRACEDASH_TRACE_MAX_SECONDS = 3600  # longest trace a bulk rebuild (manage.py summarize_traces) expects
TRACEDASH_ROLLUP_SECONDS = ENV.rollup_seconds
TRACEDASH_ROLLUP_LATE_SECONDS = ENV.rollup_late_seconds  # the late-arrival window, re-covered as a safety net
TRACEDASH_ROLLUP_LATE_EVERY_SECONDS = ENV.rollup_late_every_seconds  # ... at most this often (marked minutes: every run)
CELERY_BEAT_SCHEDULE["traces-summarize"] = {
    "task": "analytics.tasks.summarize_traces",
    "schedule": TRACEDASH_SUMMARIZE_SECONDS,
    "options": {"expires": TRACEDASH_SUMMARIZE_SECONDS * 2},
}
CELERY_BEAT_SCHEDULE["rollups-update"] = {
    "task": "analytics.tasks.update_rollups",
    "schedule": TRACEDASH_ROLLUP_SECONDS,
    "options": {"expires": TRACEDASH_ROLLUP_SECONDS * 2},
}
# The attribute index (analytics.attribute_index): backfill the keys declared since the last run
# (a key is declared the first time a chart, the Variants view or a rule groups by it; its reads
# scan the spans until its backfill is done). Cheap when nothing was declared: one small read.
TRACEDASH_ATTRIBUTE_INDEX_SECONDS = 10
CELERY_BEAT_SCHEDULE["attribute-index"] = {
    "task": "analytics.tasks.index_attributes",
    "schedule": TRACEDASH_ATTRIBUTE_INDEX_SECONDS,
    "options": {"expires": TRACEDASH_ATTRIBUTE_INDEX_SECONDS * 6},
}
# Per-project retention shorter than TRACEDASH_RETENTION_DAYS (the TTL): daily deletes of older rows
# (analytics.retention_services). The embedded beat runs it once at start, then daily.
TRACEDASH_RETENTION_ENFORCE_SECONDS = 86400
CELERY_BEAT_SCHEDULE["retention-enforce"] = {
    "task": "analytics.tasks.enforce_retention",
    "schedule": TRACEDASH_RETENTION_ENFORCE_SECONDS,
    "options": {"expires": TRACEDASH_RETENTION_ENFORCE_SECONDS},
}

# --- Alerts --------------------------------------------------------------------------------
TRACEDASH_ALERTS_DELIVERY_TIMEOUT = 5.0  # seconds per webhook/Slack attempt; retries back off (alerts.services)
TRACEDASH_PUBLIC_URL = ENV.public_url
for _name, _value in ENV.email.items():
    globals()[_name] = _value
DEFAULT_FROM_EMAIL = SERVER_EMAIL = ENV.email_from

# --- Channels -----------------------------------------------------------------------------
if ENV.channel_layer_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [ENV.channel_layer_url]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Ingestion ----------------------------------------------------------------------------
TRACEDASH_INGEST_MAX_BODY_BYTES = ENV.ingest_max_body_bytes
TRACEDASH_INGEST_MAX_SPANS = ENV.ingest_max_spans
TRACEDASH_INGEST_MAX_ATTRIBUTES = 128
TRACEDASH_INGEST_MAX_KEY_BYTES = 256
TRACEDASH_INGEST_MAX_VALUE_BYTES = 64 * 1024
TRACEDASH_INGEST_PARSE_PROCESSES = ENV.ingest_parse_processes  # ingest.parse_pool
TRACEDASH_INGEST_RATE_LIMIT = ENV.ingest_rate_limit  # spans/s per key, per web process
TRACEDASH_INGEST_RATE_BURST_SECONDS = 2.0
# How long a process answers from its memory of checked keys before it reads the key revision
# again: a key revoked elsewhere is refused within this many ms (projects.keycache). 0: no memory.
TRACEDASH_KEY_CACHE_MS = ENV.key_cache_ms
TRACEDASH_SPOOL_MAX_BYTES = ENV.ingest_spool_max_bytes
DATA_UPLOAD_MAX_MEMORY_SIZE = TRACEDASH_INGEST_MAX_BODY_BYTES

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # One line per scheduled task run is noise; failures still log at ERROR.
        "celery.app.trace": {"level": "WARNING"},
    },
}
