"""Context blocks other apps add to the planner's prompt (inner state, memory slots, summary…).

A provider is a sync function (session) -> str; an empty string means "nothing to say". The planner
renders the registered blocks in `order` (stable, cache-friendly blocks first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chat.models import ChatSession

ContextProvider = Callable[[ChatSession | None], str]


@dataclass(frozen=True)
class ContextBlock:
    name: str
    order: int
    provider: ContextProvider


_blocks: dict[str, ContextBlock] = {}


def register_context_block(name: str, provider: ContextProvider, *, order: int = 100) -> None:
    if name in _blocks:
        raise ValueError(f"context block {name!r} is already registered")
    _blocks[name] = ContextBlock(name=name, order=order, provider=provider)


def context_blocks(session: ChatSession | None) -> list[tuple[str, str]]:
    """(name, text) of every registered block with something to say, in order. Sync: call it from a
    thread (sync_to_async) when in async code."""
    out = []
    for block in sorted(_blocks.values(), key=lambda b: (b.order, b.name)):
        text = block.provider(session)
        if text:
            out.append((block.name, text))
    return out
