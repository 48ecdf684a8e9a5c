"""knowledge.search: what the operator wrote into the knowledge store (chat.KnowledgeEntry, admin ›
Knowledge), found by chat.knowledge (BM25 over words and Chinese bigrams). MaiBot 1.3's arguments
(`query`, `limit`; its memory filters `chat_id`, `person_id`, time range … have nothing to filter here)
and result: {"success", "content": "你知道这些知识: …"} or "你不太了解有关<query>的知识" when nothing matches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import db

if TYPE_CHECKING:
    from plugins.records import PluginRecord

MAX_LIMIT = 20
MAX_ENTRY_CHARS = 2_000  # of one entry's text in the answer


async def search(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.knowledge import knowledge_search

    query = str(args.get("query") or "").strip()
    if not query:
        return {"success": False, "error": "缺少必要参数 query"}
    try:
        limit = max(1, int(args.get("limit", 5)))
    except (TypeError, ValueError):
        limit = 5  # as MaiBot
    hits = await db(lambda: knowledge_search(query[:1000], min(limit, MAX_LIMIT)))
    info = "\n".join(f"{i}. {h.title}: {h.content[:MAX_ENTRY_CHARS]}" for i, h in enumerate(hits, start=1))
    return {"success": True, "content": f"你知道这些知识: {info}" if info else f"你不太了解有关{query}的知识"}
