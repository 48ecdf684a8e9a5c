"""End to end: the real maim_message 0.6.8 client → live daphne (gateway + planner runtime) → the
real openai client → FakeLLM started here → reply delivered back to the adapter; clean shutdown."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from chat.models import LLMCall, PlannerCycle
from tests.conftest import wait_for_async
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

TOKEN = "e2e-token"


async def db(fn):
    def run():
        try:
            return fn()
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()


async def test_adapter_message_gets_a_planned_reply_through_a_live_server(start_server):
    from maim_message import BaseMessageInfo, FormatInfo, MessageBase, RouteConfig, Router, Seg, TargetConfig, UserInfo

    with FakeLLM() as fake:
        fake.script(fake.tool_call("reply", {"text": "pong 你好"}))
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=TOKEN
        )
        url = base.replace("http://", "ws://") + "/ws"
        router = Router(RouteConfig(route_config={"qq": TargetConfig(url=url, token=TOKEN)}))
        received: asyncio.Queue = asyncio.Queue()

        async def on_message(message: dict) -> None:
            await received.put(message)

        router.register_class_handler(on_message)
        task = asyncio.create_task(router.run())
        try:

            async def connected() -> bool:
                return router.check_connection("qq")

            await wait_for_async(connected, what="the adapter to connect")
            info = BaseMessageInfo(
                platform="qq",
                message_id=uuid.uuid4().int % 10**9,
                time=time.time(),
                user_info=UserInfo(platform="qq", user_id=10001, user_nickname="Alice", user_cardname=""),
                format_info=FormatInfo(content_format=["text"], accept_format=["text", "reply", "emoji"]),
                additional_config={},
            )
            await router.send_message(
                MessageBase(
                    message_info=info, message_segment=Seg("seglist", [Seg("text", "ping")]), raw_message="ping"
                )
            )
            frame = await asyncio.wait_for(received.get(), timeout=30)
            texts = [s["data"] for s in frame["message_segment"]["data"] if s["type"] == "text"]
            assert texts == ["pong 你好"]
            assert frame["message_info"]["user_info"]["user_id"] in (10001, "10001")
            assert len(fake.requests) == 1 and "Alice: ping" in fake.requests[0]["messages"][1]["content"]
            # The reply reaches the adapter as soon as it is in the outbox; the cycle's record is
            # closed a moment later.
            cycle = await wait_for_async(
                lambda: PlannerCycle.objects.filter(ended_at__isnull=False).first(), timeout=15, what="the cycle closed"
            )
            assert await db(lambda: PlannerCycle.objects.count()) == 1
            assert cycle.action == "reply" and not cycle.error
            assert await db(lambda: LLMCall.objects.filter(cycle=cycle).count()) == 1
        finally:
            await router.stop()
            task.cancel()
        # SIGTERM: daphne stops the runtimes before its loop goes away.
        proc.stop()
        assert "planner runtimes stopped (1)" in proc.output()
