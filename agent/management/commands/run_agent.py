"""``python manage.py run_agent``: the resource agent (agent/cli.py) run from a server checkout, with
the endpoint defaulting to this installation's own address (``HOST``/``PORT``)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agent import cli


def default_endpoint() -> str:
    """``http://HOST:PORT`` of this installation; a wildcard bind address means this machine."""
    host = settings.ENV.host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.ENV.port}"


class Command(BaseCommand):
    help = ("Run the resource agent: sample this host's CPU, memory and GPUs (NVML) every interval and send them "
            "to /api/v1/resources. The same loop as `python -m agent`; the endpoint defaults to this server.")

    def add_arguments(self, parser):
        parser.add_argument("--endpoint", help="server base URL (default: TRACEDASH_ENDPOINT, else this "
                                               "installation's http://HOST:PORT)")
        parser.add_argument("--api-key", help="the project's ingest key (default: TRACEDASH_API_KEY)")
        parser.add_argument("--interval", help="seconds between samples (default: TRACEDASH_AGENT_INTERVAL, else 5)")
        parser.add_argument("--host", dest="sample_host", metavar="NAME", help="host name the samples carry (default: this machine's)")
        parser.add_argument("--once", action="store_true", help="take one sample, send it and exit")
        parser.add_argument("--max-buffer", help="samples kept while the server is unreachable (default 10000)")

    def handle(self, *args, endpoint, api_key, interval, sample_host, once, max_buffer, **options):
        endpoint = endpoint or os.environ.get("TRACEDASH_ENDPOINT") or default_endpoint()
        api_key = api_key or os.environ.get("TRACEDASH_API_KEY")
        if not api_key:
            raise CommandError("no ingest key: give --api-key KEY or set TRACEDASH_API_KEY "
                               "(`manage.py create_project NAME` prints a new project's key)")
        if settings.ENV.embedded_beat and not sample_host:
            self.stderr.write("note: this installation's embedded beat already samples this machine into every project; "
                              "an agent here records it a second time unless --host gives it another name")
        argv = ["--endpoint", endpoint, "--api-key", api_key]
        for flag, value in (("--interval", interval), ("--host", sample_host), ("--max-buffer", max_buffer)):
            if value is not None:
                argv += [flag, str(value)]
        if once:
            argv.append("--once")
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse: a bad value, already explained on stderr
            raise CommandError(f"invalid agent arguments (exit status {exc.code})") from None
        if code:
            raise CommandError("the server did not take every sample (see the log above)", returncode=code)
