"""`manage.py create_api_token NAME`: create a proactive API token and print it once."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from scheduling.proactive.access import api_token_create


class Command(BaseCommand):
    help = "Create a bearer token for the proactive message API; it is printed once and stored hashed."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="Who uses the token (unique).")

    def handle(self, *args, **options) -> None:
        try:
            token, raw = api_token_create(name=options["name"])
        except (ValidationError, ValueError) as exc:
            messages = getattr(exc, "messages", None) or [str(exc)]
            raise CommandError("; ".join(messages)) from None
        self.stderr.write(f"Created API token {token.name!r}. It is shown only this once:")
        self.stdout.write(raw)
