"""``python manage.py attribute_index --project NAME [--add KEY | --remove KEY | --backfill]``: the
attribute keys a project's grouped reads are indexed for (analytics.attribute_index).

Without an option it lists the project's keys, each ``ready`` (read from the index) or
``backfilling`` (still read by scanning the spans). ``--add`` declares a key before anyone groups
by it; ``--remove`` stops indexing one and deletes its rows (reads scan the spans again, with the
same results); ``--backfill`` backfills what was declared now, instead of waiting for the beat.
It opens the ClickHouse store, so in the embedded mode run it while the server is stopped.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from projects.models import Project


class Command(BaseCommand):
    help = "List, add or remove the attribute keys indexed for a project's grouped reads."

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="project name or id")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--add", metavar="KEY", help="declare KEY for the index now")
        action.add_argument("--remove", metavar="KEY", help="stop indexing KEY and delete its rows")
        action.add_argument("--backfill", action="store_true", help="backfill the declared keys now")

    def handle(self, *args, project, add, remove, backfill, **options):
        from analytics import attribute_index

        target = Project.objects.filter(pk=int(project)).first() if project.isdigit() else None
        target = target or Project.objects.filter(name=project).first()
        if target is None:
            raise CommandError(f"no project named (or numbered) {project!r}")
        if add is not None:
            if not attribute_index.key_declare(project_id=target.pk, key=add):
                raise CommandError(f"{add!r} not declared: a key is 1 to {attribute_index.MAX_KEY} characters, and a "
                                   f"project indexes at most {attribute_index.MAX_KEYS} keys (remove one first)")
            self.stdout.write(f"declared {add!r}: the summariser indexes it from now on; the next backfill "
                              f"(the beat, or --backfill) indexes the spans stored before")
        elif remove is not None:
            if not attribute_index.key_remove(project_id=target.pk, key=remove):
                raise CommandError(f"{remove!r} is not indexed for project {target.name}")
            self.stdout.write(f"removed {remove!r}: its reads scan the spans again")
        elif backfill:
            report = attribute_index.index_backfill(project_ids=[target.pk], delay_seconds=0)
            self.stdout.write(f"backfilled {report.keys} key(s): {report.rows:,} rows in {report.seconds:.1f} s")
        keys = attribute_index.indexed_keys(project_id=target.pk)
        self.stdout.write(f"project {target.name} (id {target.pk}): {len(keys)} of {attribute_index.MAX_KEYS} keys indexed")
        for k in keys:
            self.stdout.write(f"  {k.key}\t{'ready' if k.ready else 'backfilling'}\tdeclared {k.declared_at:%Y-%m-%d %H:%M:%S} UTC")
