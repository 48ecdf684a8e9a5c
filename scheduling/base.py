"""What scheduled messages and the life loop share: short ids people can type back, and who acted."""

import secrets

from django.db import models
from django.utils.translation import gettext_lazy as _

_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"


def short_id(prefix: str) -> str:
    """Short, unambiguous ids a person (or a model) can type back: `sm_k3v9xq2mtr`."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(10))


class Actor(models.TextChoices):
    """Who created, cancelled or rescheduled a scheduled message."""

    TOOL = "tool", _("Planner tool")
    OPERATOR = "operator", _("Operator")
    API = "api", _("API")
    SYSTEM = "system", _("System")
