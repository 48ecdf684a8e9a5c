"""End to end: the allcaps example plugin (real maibot-plugin-sdk) in a live server's data dir walks
through the 20 capabilities when the real maim_message client says `/allcaps`: its sends reach the
adapter as frames an adapter accepts (text, image, hybrid, forward, a custom music segment) through
the one send service and are confirmed by the adapter's echo (send.text with return_details waits for
it), its model call goes through FakeLLM and the ledger, and its proactive request makes the chat's
planner take a turn with the plugin's context in the prompt. Unusable arguments come back as errors
in the plugin (`/allcaps-bad`) and the bot keeps answering."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import struct
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from chat.models import LLMCall, Message
from tests.conftest import require_chromium, wait_for_async
from tests.fake_llm import FakeLLM
from tests.plugins.test_capabilities import ALLCAPS, FIXTURE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.long, pytest.mark.browser]

TOKEN = "allcaps-token"
ACCEPT = ["text", "image", "emoji", "reply", "forward", "music", "command"]


async def db(fn):
    def run():
        try:
            return fn()
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()


def segments_of(frame: dict) -> list[dict]:
    top = frame["message_segment"]
    return top["data"] if top["type"] == "seglist" else [top]


def text_of(frame: dict) -> str:
    return "".join(s["data"] for s in segments_of(frame) if s["type"] == "text")


def png_size(encoded: str) -> tuple[int, int]:
    data = base64.b64decode(encoded)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])


async def test_the_example_plugin_calls_every_capability_through_a_live_server(start_server, tmp_path):
    from maim_message import BaseMessageInfo, FormatInfo, MessageBase, RouteConfig, Router, Seg, TargetConfig, UserInfo

    require_chromium()
    shutil.copytree(FIXTURE, tmp_path / "data-web" / "plugins" / "allcaps")
    with FakeLLM() as fake:
        fake.script(
            fake.text("Teal is the colour of calm water."),  # the plugin's llm.generate
            fake.tool_call("reply", {"text": "Teal suits you, by the way."}),  # the proactive turn
        )
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=TOKEN
        )
        url = base.replace("http://", "ws://") + "/ws"
        router = Router(RouteConfig(route_config={"qq": TargetConfig(url=url, token=TOKEN)}))
        frames: list[dict] = []
        platform_ids = itertools.count(880_001)

        async def on_message(message: dict) -> None:
            frames.append(message)
            # As the NapCat adapter does once QQ accepted the send: the platform's id comes back.
            echo = {"type": "echo", "echo": message["message_info"]["message_id"], "actual_id": next(platform_ids)}
            await router.send_custom_message("qq", "message_id_echo", echo)

        router.register_class_handler(on_message)
        task = asyncio.create_task(router.run())
        try:

            async def connected() -> bool:
                return router.check_connection("qq")

            await wait_for_async(connected, what="the adapter to connect")
            await asyncio.to_thread(proc.wait_for_output, "plugins loaded: 1 of 1", 60)

            async def say(text: str) -> None:
                info = BaseMessageInfo(
                    platform="qq",
                    message_id=uuid.uuid4().int % 10**9,
                    time=time.time(),
                    user_info=UserInfo(platform="qq", user_id=10001, user_nickname="Alice", user_cardname=""),
                    format_info=FormatInfo(content_format=["text"], accept_format=ACCEPT),
                    additional_config={},
                )
                segment = Seg("seglist", [Seg("text", text)])
                await router.send_message(MessageBase(message_info=info, message_segment=segment, raw_message=text))

            await say("/allcaps")

            def frame_with(prefix: str) -> dict | None:
                return next((f for f in frames if text_of(f).startswith(prefix)), None)

            async def walked() -> bool:
                return frame_with("caps: {") is not None and frame_with("Teal suits you") is not None

            try:
                await wait_for_async(walked, timeout=90, what="the plugin's report and the proactive reply")
            except AssertionError:
                raise AssertionError(f"frames: {[text_of(f)[:80] for f in frames]}\n{proc.output()[-6000:]}") from None
            report = json.loads(text_of(frame_with("caps: {")).removeprefix("caps: "))
            started = frame_with("caps: starting")
            # send.text waited for the adapter's echo: the plugin got the platform's id, and found the
            # message by it.
            assert report["first_sent"] is True and report["first_platform_id"].isdigit()
            assert report["get_by_id"] == "caps: starting"
            assert report["get_recent"][:2] == ["/allcaps", "caps: starting"]
            assert report["get_by_time_in_chat"] >= 2
            assert report["config_get"] == "麦麦"
            assert report["models"] == ["utility"]
            assert report["llm_generate"] == "Teal is the colour of calm water."
            assert report["api_call"] == {"echo": "PING"}
            assert report["me"] is True and report["opened_created"] is True and report["group_stream"] is True
            assert report["group_streams"] == ["9090"] and report["all_streams"] == 2
            assert report["render"] == ["image/png", 120, 40]
            for capability in ("send_image", "send_hybrid", "send_forward", "send_custom"):
                assert report[capability] is True, capability
            assert report["context_append"] is True and report["proactive"] is True

            # What the adapter received, segment by segment.
            images = [f for f in frames if [s["type"] for s in segments_of(f)] == ["image"]]
            assert len(images) == 1 and png_size(segments_of(images[0])[0]["data"]) == (120, 40)
            (hybrid,) = [f for f in frames if [s["type"] for s in segments_of(f)] == ["text", "image"]]
            assert segments_of(hybrid)[0]["data"] == "teal card:"
            (forward,) = [f for f in frames if segments_of(f)[0]["type"] == "forward"]
            alice, bob = segments_of(forward)[0]["data"]
            assert alice["message_info"]["user_info"]["user_nickname"] == "Alice"
            assert alice["message_segment"]["data"] == [{"type": "text", "data": "first node"}]
            assert bob["message_info"]["user_info"]["user_id"] == 20002
            assert png_size(bob["message_segment"]["data"][0]["data"]) == (120, 40)
            (music,) = [f for f in frames if segments_of(f)[0]["type"] == "music"]
            assert segments_of(music) == [{"type": "music", "data": {"type": "163", "id": "1901371647"}}]
            assert started["message_info"]["user_info"]["user_id"] == 10001  # sent to Alice

            # The proactive turn: the planner ran with nobody writing, the plugin's context in its prompt.
            assert len(fake.requests) == 2
            prompt = fake.requests[1]["messages"][-1]["content"]
            assert f"- from plugin {ALLCAPS}: The user's favourite colour is teal." in prompt
            assert f"- plugin {ALLCAPS} asks you to act: tell the user something nice about teal" in prompt
            ledger = await db(lambda: sorted(LLMCall.objects.values_list("purpose", flat=True)))
            assert ledger == ["planner", f"plugin:{ALLCAPS}"[:32]]
            # Every plugin send is an outbound message whose delivery the adapter confirmed.
            sent = await wait_for_async(
                lambda: (
                    rows
                    if len(rows := list(Message.objects.filter(extra__plugin=ALLCAPS))) == 6
                    and all(m.delivery_status == "delivered" for m in rows)
                    else None
                ),
                what="the plugin's 6 sends delivered",
            )
            assert {m.extra["capability"] for m in sent} == {
                "send.text", "send.image", "send.hybrid", "send.forward", "send.custom",
            }  # fmt: skip

            await say("/allcaps-bad")

            async def bad_report() -> dict | None:
                frame = frame_with("bad: {")
                return json.loads(text_of(frame).removeprefix("bad: ")) if frame else None

            bad = await wait_for_async(bad_report, what="the bad-arguments report")
            assert {k: v for k, v in bad.items() if k.startswith("send") or k == "no_stream"} == {
                "send.text": False, "send.image": False, "send.custom": False, "send.forward": False,
                "send.hybrid": False, "no_stream": False,
            }  # fmt: skip
            assert "needs html" in bad["render"]["error"]
            assert "neither a Unix timestamp" in bad["by_time"]["error"]
            assert bad["open_session"]["error"] == "a group chat needs group_id"
            assert "no chat with stream_id no-such-stream" in bad["proactive"]["error"]
            assert bad["context"]["success"] is False and bad["llm"]["success"] is False
            assert "no API test.maibot.nobody.nothing" in bad["api"]["error"]
            assert bad["video"] == "capability send.video is not supported by this host"
            assert len(fake.requests) == 2  # commands intercept: no model call for either
            assert proc.popen.poll() is None
        finally:
            await router.stop()
            task.cancel()
