"""Regenerate config/bot_config.toml from the descriptions in core/config/."""

from django.core.management.base import BaseCommand

from core.config import TEMPLATE_PATH, render_template


class Command(BaseCommand):
    help = "Write the commented bot_config.toml template generated from the config model."

    def handle(self, *args, **options) -> None:
        TEMPLATE_PATH.write_text(render_template(), encoding="utf-8")
        self.stdout.write(f"wrote {TEMPLATE_PATH}")
