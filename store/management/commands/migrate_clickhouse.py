from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from store import StoreError, get_store
from store.migrator import MigrationContext, migrate, pending


class Command(BaseCommand):
    help = "Apply pending ClickHouse migrations (store/clickhouse_migrations), recording each in schema_migrations."

    def add_arguments(self, parser):
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--plan", action="store_true", help="print the SQL of pending migrations; apply nothing")
        group.add_argument("--check", action="store_true", help="exit 1 if any migration is pending; apply nothing")

    def handle(self, *args, plan=False, check=False, **options):
        store = get_store()
        ctx = MigrationContext(
            retention_days=settings.TRACEDASH_RETENTION_DAYS, cluster=settings.TRACEDASH_CLICKHOUSE_CLUSTER,
            database=store.database,
        )
        try:
            todo = pending(store, ctx)
            if plan:
                if not todo:
                    self.stdout.write("No pending ClickHouse migrations.")
                for migration in todo:
                    self.stdout.write(f"-- {migration.name}")
                    for statement in migration.statements(ctx):
                        self.stdout.write(statement.rstrip() + ";\n")
                return
            if check:
                if todo:
                    names = ", ".join(m.name for m in todo)
                    raise CommandError(f"{len(todo)} pending ClickHouse migration(s): {names}", returncode=1)
                self.stdout.write("ClickHouse schema is up to date.")
                return
            applied = migrate(store, ctx, echo=self.stdout.write)
        except StoreError as exc:
            raise CommandError(f"ClickHouse ({store.describe()}): {exc}") from exc
        if applied:
            self.stdout.write(self.style.SUCCESS(f"Applied {len(applied)} ClickHouse migration(s) to {store.describe()}."))
        else:
            self.stdout.write(f"No ClickHouse migrations to apply ({store.describe()}).")
