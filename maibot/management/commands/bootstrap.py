"""First-run set-up for `make run`: migrate, then make sure an operator account exists."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Migrate and create the operator account on first run (prints its credentials once)."

    def handle(self, *args, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
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
