"""`manage.py create_api_token NAME`: create a proactive API token and print it once."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from api.access import api_token_create
from chat.models import ApiScope


class Command(BaseCommand):
    help = "Create a bearer token for the proactive message API; it is printed once and stored hashed."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="Who uses the token (unique).")
        parser.add_argument(
            "--scope",
            action="append",
            choices=ApiScope.values,
            help="What it may do (repeatable). Default: send, read_own, cancel (its own messages only).",
        )
        parser.add_argument("--channel", action="append", default=[], help="A platform it may send to (repeatable).")
        parser.add_argument(
            "--conversation", action="append", default=[], help="A conversation id it may send to (repeatable)."
        )

    def handle(self, *args, **options) -> None:
        try:
            token, raw = api_token_create(
                name=options["name"],
                scopes=options["scope"],
                allowed_channels=options["channel"],
                allowed_conversations=options["conversation"],
            )
        except (ValidationError, ValueError) as exc:
            messages = getattr(exc, "messages", None) or [str(exc)]
            raise CommandError("; ".join(messages)) from None
        self.stderr.write(
            f"Created API token {token.name!r} with scopes {', '.join(token.scopes)}. It is shown only this once:"
        )
        self.stdout.write(raw)
