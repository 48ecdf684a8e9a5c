"""Operator console for conversations: sessions and messages (conversations), the planner's record
(cycles), the LLM usage page (usage). These records are read-only here: they are history."""

from chat.admin import conversations, cycles, usage  # noqa: F401 - each registers its ModelAdmins
from chat.admin.base import ReadOnlyAdmin, ReadOnlyInline, badge, fate_badge

__all__ = ["ReadOnlyAdmin", "ReadOnlyInline", "badge", "fate_badge"]
