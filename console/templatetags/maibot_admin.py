"""Template tags for the operator console's own templates."""

from django import template

from core.config import get_config

register = template.Library()


@register.simple_tag
def bot_offline() -> bool:
    """True when no model is configured and the offline planner answers."""
    return get_config().offline
