"""Test helpers for the planner: store inbound messages as the gateway will, wake runtimes, wait."""

from __future__ import annotations

import itertools

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.models import ChatSession, Direction, Message, SourceKind
from chat.services import inbound_stored
from core import config
from tests.conftest import wait_for_async
from tests.fake_llm import FakeLLM

_platform_ids = itertools.count(900_000)


def inbound_store(
    *,
    session: ChatSession,
    text: str,
    sender_id: str = "",
    sender_nickname: str = "",
    platform_message_id: str = "",
    reply_to_platform_id: str = "",
) -> Message:
    """An inbound user message row, as the gateway stores one (stand-in until the gateway lands)."""
    return Message.objects.create(
        session=session,
        direction=Direction.IN,
        source_kind=SourceKind.USER,
        platform_message_id=platform_message_id or str(next(_platform_ids)),
        sender_id=sender_id or session.user_id,
        sender_nickname=sender_nickname or session.user_nickname or "someone",
        segments=[{"type": "text", "data": text}],
        text=text,
        reply_to_platform_id=reply_to_platform_id,
        time=timezone.now(),
    )


async def say(session: ChatSession, text: str, *, from_thread: bool = False, **kw) -> Message:
    """Store an inbound message and send `inbound_stored`: directly on the event loop, or as the
    gateway does (`asend_robust`, which runs sync receivers in asgiref's thread)."""
    message = await sync_to_async(inbound_store)(session=session, text=text, **kw)
    if from_thread:
        for _receiver, result in await inbound_stored.asend_robust(sender=Message, messages=[message]):
            assert not isinstance(result, Exception), result
    else:
        inbound_stored.send(sender=Message, messages=[message])
    return message


async def settled(runtimes, session: ChatSession, timeout: float = 20.0) -> None:
    """Wait until the session's live runtime has ended its look at every inbound message stored so far
    (a cycle run or skipped): after this, "nothing came of them" can be asserted without a sleep."""
    newest = await Message.objects.filter(session=session, direction=Direction.IN).order_by("-pk").afirst()

    async def decided() -> bool:
        runtime = runtimes.get(session.pk)
        return runtime is not None and runtime.decided_pk >= (newest.pk if newest else 0)

    await wait_for_async(decided, timeout=timeout, what=f"the runtime of session {session.pk} to decide")


# --- fixtures (import them into a test module) --------------------------------------------------------


@pytest.fixture(name="fake_llm")
def fake_llm_fixture():
    """FakeLLM as the configured model, with a short debounce so tests stay quick."""
    with (
        FakeLLM() as server,
        config.override(
            llm={"base_url": server.base_url, "model": "fake-model", "max_retries": 0},
            chat={"debounce_seconds": 0.2},
        ),
    ):
        yield server


@pytest_asyncio.fixture(name="runtimes")
async def runtimes_fixture():
    """The process's runtime runtimes, stopped cleanly after the test."""
    from chat.runtime import runtimes

    yield runtimes
    await runtimes.shutdown()
