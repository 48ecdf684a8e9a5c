"""Operator console for conversations: sessions and messages (conversations), the planner's record
(cycles), the LLM usage page (usage): read-only, they are history; and the emoji library (emojis),
whose descriptions the operator edits."""

from chat.admin import conversations, cycles, emojis, usage  # noqa: F401 - each registers its ModelAdmins
from chat.admin.base import ReadOnlyAdmin, ReadOnlyInline, badge, fate_badge

__all__ = ["ReadOnlyAdmin", "ReadOnlyInline", "badge", "fate_badge"]
