"""Fixtures for tests/chat (each area keeps its fixtures in its own support module)."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from chat.gateway import close_old_connection, get_gateway
from core.adapter_tokens import parse_adapter_tokens
from tests.chat.gateway_helpers import ADAPTER_TOKENS


@pytest.fixture
async def app(settings):
    """The project's ASGI application; afterwards the gateway's tasks and threads are released, and any
    session runtime an inbound message started on this test's loop is stopped."""
    settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens(ADAPTER_TOKENS, name="MAIBOT_ADAPTER_TOKENS")
    from maibot.asgi import application

    yield application
    from chat.runtime import runtimes

    if runtimes.loop is asyncio.get_running_loop():
        await runtimes.shutdown()
    await get_gateway().aclose()
    # Sync receivers and helpers ran in asgiref's shared thread: release its connection too.
    await sync_to_async(close_old_connection)()
