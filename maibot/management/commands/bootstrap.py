"""First-run set-up: make the data dir private, refuse one newer than this build, migrate, stamp it, and see to the
operator account.

`make run` creates the account and prints its credentials once; `maibot` (the single file) leaves it to the
set-up page in the browser unless DJANGO_SUPERUSER_PASSWORD is given.
"""

import io
import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core import datadir, setup
from core.listen import open_urls
from plugins.host_base import plugins_dir


class _MigrationProgress(io.TextIOBase):
    """Takes migrate's output (verbosity 1) and says only how far it is: a line at each quarter."""

    def __init__(self, say, total: int) -> None:
        self.say, self.total, self.done, self.said = say, total, 0, 0

    def write(self, text: str) -> int:
        if "Applying " in text:
            self.done += 1
            quarter = self.done * 4 // self.total
            if quarter > self.said:
                self.said = quarter
                self.say(f"  migrated {quarter * 25} % ({self.done} of {self.total})")
        return len(text)


def pending_migrations() -> int:
    """How many migrations `migrate` would apply to the data dir's database."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))


class Command(BaseCommand):
    help = "Migrate and create the operator account on first run (prints its credentials once)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--setup-page",
            action="store_true",
            help="Leave the operator account to the browser set-up page (unless DJANGO_SUPERUSER_PASSWORD is set).",
        )

    def migrate(self) -> None:
        """Bring the database up to this build, saying how far it is when there is anything to do (a
        first start creates every table: seconds of silence otherwise)."""
        pending = pending_migrations()
        if not pending:
            return
        what = f"{pending} migration{'s' if pending > 1 else ''}"
        self.stdout.write(f"Preparing the data dir: {what} to apply (a first start or an upgrade)")
        self.stdout.flush()
        progress = _MigrationProgress(lambda line: (self.stdout.write(line), self.stdout.flush()), pending)
        call_command("migrate", interactive=False, verbosity=1, stdout=progress)

    def handle(self, *args, **options) -> None:
        datadir.make_private(settings.DATA_DIR)  # a data dir of an earlier version: 0755 and 0644 files
        try:
            datadir.check_not_newer()
        except datadir.DataDirTooNew as exc:
            raise CommandError(f"Refusing to start: {exc}") from None
        self.migrate()
        datadir.write_stamp()
        # There from the first run, so that a plugin copied in later is seen (the server watches it).
        plugins_dir().mkdir(mode=datadir.PRIVATE_DIR_MODE, exist_ok=True)
        User = get_user_model()
        if setup.operator_exists():
            setup.close()  # an operator made meanwhile (`createsuperuser`) ends a pending set-up
            return
        if options["setup_page"] and not os.environ.get("DJANGO_SUPERUSER_PASSWORD"):
            code = setup.issue_code()
            # Bound to every address (0.0.0.0, ::): each address it can be opened at, never "0.0.0.0".
            pages = "".join(f"\n  set-up page:   {url}" for url in open_urls(settings.HOST, settings.PORT, "/setup/"))
            self.stdout.write(
                self.style.WARNING("First run: finish the set-up in your browser")
                + pages
                + f"\n  one-time code: {code}  (the page asks for it)"
            )
            return
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD") or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(
                "Created operator account\n"
                f"  username: {username}\n"
                f"  password: {password}\n"
                "Keep it: it is shown only this once."
            )
        )
