"""Operator console for conversations: sessions and messages (conversations), the planner's record
(cycles), the LLM usage page (usage): read-only, they are history; the emoji library (emojis), whose
descriptions the operator edits, and the knowledge store (knowledge) the operator fills."""

from chat.admin import conversations, cycles, emojis, knowledge, usage  # noqa: F401 - each registers its ModelAdmins
from chat.admin.base import ReadOnlyAdmin, ReadOnlyInline, badge, fate_badge

__all__ = ["ReadOnlyAdmin", "ReadOnlyInline", "badge", "fate_badge"]
