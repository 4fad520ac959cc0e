from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from projects.services import membership_add, project_create


class Command(BaseCommand):
    help = "Create a project and print its new ingest key on the last line (shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--member", action="append", default=[], metavar="USERNAME",
                            help="add this existing user as a member (repeatable)")

    def handle(self, *args, name, member, **options):
        name = name.strip()
        if not name:
            raise CommandError("the project name is empty")
        User = get_user_model()
        users = []
        for username in member:
            user = User.objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user named {username!r}")
            users.append(user)
        try:
            project, key = project_create(name=name)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        for user in users:
            membership_add(project=project, user=user)
        self.stdout.write(f"Created project {project.name!r} (id {project.pk}). Its ingest key, shown only once:")
        self.stdout.write(key)
