"""The production docker-compose.yml and Dockerfile wire every service and every config variable.

Static checks only (no Docker, no database): the file is parsed with ``yaml.safe_load`` and the app
environment is run through the same parsers ``config.env`` uses at start-up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from config.env import VARIABLES, parse_clickhouse_url, parse_database_url

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

APP_SERVICES = ("migrate", "web", "worker", "beat")
REQUIRED_SERVICES = ("clickhouse", "postgres", "redis", *APP_SERVICES)
# Read by `make run` only; the compose web passes --host/--port on its command line.
NOT_IN_COMPOSE = {"HOST", "PORT"}

_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def expand(value: str) -> str:
    """Expand compose interpolation as if no variable were set in the shell.

    ``${NAME:-default}`` becomes the default, ``${NAME:?message}`` (a required variable) a 48-character
    dummy, ``$$`` a literal ``$``. A bare ``${NAME}`` has no value to use and fails the test.
    """

    def replace(match: re.Match) -> str:
        op = match.group("op")
        if op in (":-", "-"):
            return match.group("arg")
        if op in (":?", "?"):
            return "x" * 48
        raise AssertionError(f"{match.group(0)} has no default: an unset shell variable would leave it empty")

    return _REFERENCE.sub(replace, str(value)).replace("$$", "$")


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def depends_on(service: dict) -> dict[str, dict]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return deps


def healthcheck_command(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def image_is_pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    if "@sha256:" in image:
        return True
    return bool(name) and "/" not in tag and tag != "latest" and any(ch.isdigit() for ch in tag)


def volume_sources(service: dict) -> dict[str, str]:
    """Map container path -> source (named volume or host path) for a service's volumes."""
    result = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            result[volume["target"]] = volume.get("source", "")
        else:
            source, _, rest = volume.partition(":")
            result[rest.split(":")[0]] = source
    return result


@pytest.fixture(scope="module")
def compose() -> dict:
    assert COMPOSE.is_file(), f"{COMPOSE} is missing"
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def test_no_obsolete_version_key(compose):
    assert "version" not in compose


def test_required_services_exist(services):
    missing = [name for name in REQUIRED_SERVICES if name not in services]
    assert not missing, f"docker-compose.yml lacks services {missing}"


def test_images_are_pinned_or_built_here(services):
    for name, service in services.items():
        image = service.get("image")
        assert image or "build" in service, f"{name} has neither image nor build"
        if image is None:
            continue
        if image.startswith("tracedash:"):
            assert "build" in service, f"{name} uses the local image {image} but does not build it"
        else:
            assert image_is_pinned(image), f"{name} image {image!r} is not pinned to a version tag"


def test_app_services_share_the_locally_built_image(services):
    images = {services[name].get("image") for name in APP_SERVICES}
    assert len(images) == 1, f"app services use different images: {images}"
    (image,) = images
    assert image and image.startswith("tracedash:")
    for name in APP_SERVICES:
        assert services[name].get("build") in (".", {"context": "."}), f"{name} does not build from the Dockerfile"


def test_clickhouse_uses_the_official_image(services):
    image = services["clickhouse"]["image"]
    assert image.split(":")[0] == "clickhouse/clickhouse-server"
    tag = image.split(":")[1]
    # at least major.minor
    assert re.fullmatch(r"\d+\.\d+(\.\d+)*(-[a-z0-9.]+)?", tag), f"clickhouse tag {tag!r} is not a version"
    assert services["clickhouse"]["ulimits"]["nofile"]["soft"] >= 262144


def test_healthchecks(services):
    expected = {"clickhouse", "postgres", "redis", "web", "worker"}
    for name in expected:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
        assert not services[name]["healthcheck"].get("disable"), f"{name} healthcheck is disabled"
    # One-shot migrate and Celery beat (no ping endpoint) deliberately have none.
    assert "healthcheck" not in services["migrate"]
    assert "healthcheck" not in services["beat"]

    assert "SELECT 1" in healthcheck_command(services["clickhouse"])
    assert "pg_isready" in healthcheck_command(services["postgres"])
    assert "redis-cli ping" in healthcheck_command(services["redis"])
    web_check = healthcheck_command(services["web"])
    assert "http://127.0.0.1:8000/healthz" in web_check and "urllib" in web_check
    worker_check = healthcheck_command(services["worker"])
    assert "inspect ping" in worker_check
    # $$ in compose is a literal $; the hostname must reach the shell, so the shell form is required.
    assert services["worker"]["healthcheck"]["test"][0] == "CMD-SHELL"
    assert "celery@$$HOSTNAME" in worker_check


def test_every_config_variable_is_wired(services):
    wanted = set(VARIABLES) - NOT_IN_COMPOSE
    assert "TRACEDASH_CLICKHOUSE_URL" in wanted and "HOST" not in wanted
    for service in APP_SERVICES:
        env = environment(services[service])
        missing = sorted(wanted - set(env))
        assert not missing, f"{service} environment lacks {missing}"
        unknown = sorted(set(env) - set(VARIABLES))
        assert not unknown, f"{service} sets variables config/env.py does not read: {unknown}"


def test_app_environment_values(services):
    env = environment(services["web"])
    assert env["TRACEDASH_DEBUG"] == "0"
    assert env["TRACEDASH_DATA_DIR"] == "/data"
    assert env["TRACEDASH_SECRET_KEY"].startswith("${TRACEDASH_SECRET_KEY:?"), "the secret key must be required"
    assert expand(env["TRACEDASH_CLICKHOUSE_CLUSTER"]) == ""
    assert int(expand(env["TRACEDASH_RETENTION_DAYS"])) == 30
    assert int(expand(env["TRACEDASH_BEAT_SAMPLE_SECONDS"])) == 10
    assert expand(env["CELERY_BROKER_URL"]).startswith("redis://redis:6379/")
    assert expand(env["TRACEDASH_CHANNEL_LAYER_URL"]).startswith("redis://redis:6379/")
    assert expand(env["CELERY_BROKER_URL"]) != expand(env["TRACEDASH_CHANNEL_LAYER_URL"])
    assert "localhost" in expand(env["TRACEDASH_ALLOWED_HOSTS"]).split(",")
    assert volume_sources(services["web"]).get("/data") == "appdata"


def test_clickhouse_url_reaches_the_clickhouse_service(services):
    url = parse_clickhouse_url(expand(environment(services["web"])["TRACEDASH_CLICKHOUSE_URL"]))
    server = {key: expand(value) for key, value in environment(services["clickhouse"]).items()}
    assert (url.host, url.port) == ("clickhouse", 9000)
    assert url.database == server["CLICKHOUSE_DB"] == "tracedash"
    assert url.user == server["CLICKHOUSE_USER"]
    assert url.password == server["CLICKHOUSE_PASSWORD"]
    assert url.secure is False


def test_database_url_reaches_the_postgres_service(services):
    database = parse_database_url(expand(environment(services["web"])["DATABASE_URL"]), Path("/data"))
    server = {key: expand(value) for key, value in environment(services["postgres"]).items()}
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["PORT"]) == ("postgres", "5432")
    assert database["NAME"] == server["POSTGRES_DB"]
    assert database["USER"] == server["POSTGRES_USER"]
    assert database["PASSWORD"] == server["POSTGRES_PASSWORD"]


def test_startup_order(services):
    assert depends_on(services["web"]).get("migrate", {}).get("condition") == "service_completed_successfully"
    for name in ("worker", "beat"):
        assert depends_on(services[name]).get("migrate", {}).get("condition") == "service_completed_successfully"
    for name in ("web", "worker", "beat"):
        assert depends_on(services[name]).get("redis", {}).get("condition") == "service_healthy"
    migrate_deps = depends_on(services["migrate"])
    for name in ("clickhouse", "postgres"):
        assert migrate_deps.get(name, {}).get("condition") == "service_healthy"
    assert "migrate_clickhouse" in services["migrate"]["command"]


def test_restart_policies(services):
    # Unquoted `no` would be YAML false; compose wants the string.
    assert services["migrate"].get("restart") == "no"
    for name in ("clickhouse", "postgres", "redis", "web", "worker", "beat"):
        assert services[name].get("restart") == "unless-stopped", f"{name} is not restarted"


def test_web_serves_on_8000(services):
    web = services["web"]
    assert "8000:8000" in [str(port) for port in web.get("ports", [])]
    assert "--port 8000" in web["command"] and "--host 0.0.0.0" in web["command"]


def test_data_lives_in_named_volumes(compose, services):
    declared = set(compose.get("volumes") or {})
    expected = {
        "clickhouse": "/var/lib/clickhouse",
        "postgres": "/var/lib/postgresql/data",
        "redis": "/data",
    }
    for name, path in expected.items():
        source = volume_sources(services[name]).get(path)
        assert source, f"{name} keeps {path} in the container layer"
        assert source in declared, f"{name} volume {source!r} is not declared under volumes:"
    assert "appdata" in declared


def test_dockerfile():
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    bases = [line.split()[1] for line in lines if line.upper().startswith("FROM ")]
    assert bases, "Dockerfile has no FROM"
    for base in bases:
        assert base.startswith("python:3.11"), f"unexpected base image {base}"
        assert image_is_pinned(base), f"base image {base!r} is not pinned"
    assert re.search(r"pip install[^\n]*--no-cache-dir[^\n]*-r requirements\.lock", text)
    assert re.search(r"COPY\s+requirements\.lock\b", text)
    assert "collectstatic --noinput" in text
    assert "TRACEDASH_SECRET_KEY=" in text
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1] == "tracedash", "the image must run as the non-root tracedash user"
    assert any(line.upper() == "EXPOSE 8000" for line in lines)
    assert re.search(r"ENV\s+PYTHONUNBUFFERED=1", text)


def test_the_test_override_publishes_clickhouse_native_port_on_loopback_only(services):
    """docker-compose.test.yml (README "Tests") lets TRACEDASH_TEST_CLICKHOUSE_URL reach the
    stack's ClickHouse: it publishes the native port, on 127.0.0.1 only, and nothing else."""
    override = yaml.safe_load((ROOT / "docker-compose.test.yml").read_text())
    assert set(override) == {"services"} and set(override["services"]) == {"clickhouse"}
    assert set(override["services"]["clickhouse"]) == {"ports"}
    assert override["services"]["clickhouse"]["ports"] == ["127.0.0.1:19000:9000"]
    assert "clickhouse" in services
    readme = (ROOT / "README.md").read_text()
    assert "docker compose -f docker-compose.yml -f docker-compose.test.yml up -d --wait clickhouse" in readme
    url = parse_clickhouse_url("clickhouse://tracedash:tracedash@127.0.0.1:19000/tracedash_test")
    assert f"TRACEDASH_TEST_CLICKHOUSE_URL=clickhouse://tracedash:tracedash@127.0.0.1:{url.port}/" in readme
    # The URL's user and password are the stack's defaults.
    env = environment(services["clickhouse"])
    assert (expand(env["CLICKHOUSE_USER"]), expand(env["CLICKHOUSE_PASSWORD"])) == (url.user, url.password)
