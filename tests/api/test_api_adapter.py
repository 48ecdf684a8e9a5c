"""Proactive API messages reach a live adapter: the real maim_message 0.6.8 client (Router) connected
to a live daphne receives a message sent now and one scheduled (delivered by a real qcluster)."""

from __future__ import annotations

import asyncio
import base64
from datetime import timedelta

import pytest
from django.utils import timezone

from api.access import api_token_create
from chat.fate import SENDER_FATE
from chat.models import Message
from tests.api.support import png_base64, png_bytes
from tests.api.test_api_live import http
from tests.chat.gateway_helpers import Adapter06
from tests.conftest import db, wait_for_async
from tests.conftest import wait_for as poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

ADAPTER_TOKEN = "adapter-secret-api"


async def api_call(method: str, url: str, body=None, headers=None):
    return await asyncio.to_thread(http, method, url, body, headers)


async def test_adapter_receives_immediate_and_scheduled_api_messages(start_server, shared_qcluster):
    _, base = start_server(MAIBOT_ADAPTER_TOKENS=ADAPTER_TOKEN)
    _, raw = await db(api_token_create, name="adapter-test")
    auth = {"Authorization": f"Bearer {raw}"}
    adapter = await Adapter06(base, token=ADAPTER_TOKEN).start()
    try:
        # Sent now: the 201 comes once it is in the outbox (the deliverer may already have handed it to
        # the adapter); the adapter gets the frame.
        status, _, now_msg = await api_call(
            "POST",
            f"{base}/api/v1/messages",
            {"channel_type": "qq", "channel_user_id": "10001", "text": "现在提醒 now"},
            auth,
        )
        assert status == 201 and now_msg["status"] in {"sending", "sent"}, now_msg
        assert now_msg["status"] == SENDER_FATE[now_msg["delivery"]["status"]], now_msg
        frame = await adapter.next_message()
        assert frame["message_info"]["message_id"] == now_msg["delivery"]["message_id"]
        assert str(frame["message_info"]["user_info"]["user_id"]) == "10001"
        assert frame["message_segment"] == {"type": "seglist", "data": [{"type": "text", "data": "现在提醒 now"}]}
        await adapter.echo(now_msg["delivery"]["message_id"], 987654321)

        async def delivered(msg_id: str, platform_id: str) -> dict:
            seen: dict = {}

            def receipt() -> bool:
                seen.update(http("GET", f"{base}/api/v1/messages/{msg_id}", headers=auth)[2])
                return bool(seen["delivery"]) and seen["delivery"]["platform_message_id"] == platform_id

            if not await asyncio.to_thread(poll, receipt):
                raise AssertionError(f"no receipt for {msg_id}: {seen}")
            return seen

        detail = await delivered(now_msg["id"], "987654321")
        assert detail["status"] == detail["delivery"]["status"] == "delivered" and detail["delivery"]["delivered_at"]
        assert detail["delivery"]["sent_at"] <= detail["delivery"]["delivered_at"]

        # Scheduled 2 s ahead, with an image: the cluster's dispatcher sends it, the gateway delivers it.
        send_at = timezone.now() + timedelta(seconds=2)
        status, _, later = await api_call(
            "POST",
            f"{base}/api/v1/messages",
            {
                "conversation_id": now_msg["conversation"]["conversation_id"],
                "type": "image",
                "text": "稍后 later",
                "image": {"base64": png_base64()},
                "send_at": send_at.isoformat(),
            },
            auth,
        )
        assert status == 201 and later["status"] == "pending", later
        frame = await adapter.next_message(timeout=30)
        segments = frame["message_segment"]["data"]
        assert segments[0] == {"type": "text", "data": "稍后 later"}
        assert segments[1]["type"] == "image" and base64.b64decode(segments[1]["data"]) == png_bytes()
        await adapter.echo(frame["message_info"]["message_id"], 987654322)
        detail = await delivered(later["id"], "987654322")
        assert detail["status"] == "delivered" and detail["delivery"]["status"] == "delivered"
        kinds = await wait_for_async(
            lambda: list(Message.objects.filter(direction="out").values_list("source_kind", flat=True)),
            what="outbound history",
        )
        assert kinds == ["proactive", "proactive"]
    finally:
        await adapter.stop()
