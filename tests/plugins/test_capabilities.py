"""The capabilities in-process, called by a plugin written against the real maibot-plugin-sdk
(tests/plugins/capability_fixtures/allcaps) through its own PluginContext: what each answers with our
data and services, in the shape the SDK hands the plugin; unusable arguments are error results, never a
crash; what the adapter receives for images, forwards, hybrids and custom segments. The whole walk
through a live server and the real maim_message client is in test_capabilities_live.py."""

from __future__ import annotations

import asyncio
import base64
import shutil
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chat.components import context_blocks
from chat.models import ChatSession, Direction, LLMCall, Media, Message
from chat.planner.prompts import instruction
from chat.wire.outbound import adapter_envelope
from core import config
from core.config import get_config
from plugins.capabilities import SUPPORTED, maisaka
from plugins.capabilities.common import MAX_MEDIA_BYTES
from plugins.host import PluginHost, PluginState
from tests.chat.planner_helpers import fake_llm_fixture, inbound_store, runtimes_fixture  # noqa: F401
from tests.conftest import require_chromium
from tests.fake_llm import FakeLLM

pytestmark = pytest.mark.django_db(transaction=True)

ALLCAPS = "test.maibot.allcaps"
FIXTURE = Path(__file__).resolve().parent / "capability_fixtures" / "allcaps"
# The 20 capabilities issue #14 names: the most declared in MaiBot's public plugin index.
TWENTY = {
    "send.text", "config.get", "llm.generate", "send.image", "api.call", "message.get_by_id",
    "message.get_recent", "chat.get_stream_by_group_id", "send.custom", "send.forward",
    "message.get_by_time_in_chat", "chat.get_stream_by_user_id", "llm.get_available_models",
    "maisaka.proactive.trigger", "chat.get_group_streams", "maisaka.context.append", "chat.get_all_streams",
    "send.hybrid", "render.html2png", "chat.open_session",
}  # fmt: skip


def png(width: int = 3, height: int = 2) -> bytes:
    """A real (tiny) PNG, built by hand: signature, IHDR, IDAT, IEND."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x00\x80\x80" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


PNG64 = base64.b64encode(png()).decode()


@pytest.fixture
def allcaps(tmp_path):
    """A started PluginHost with the allcaps example plugin; (host, its PluginContext)."""
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE, directory / "allcaps", ignore=shutil.ignore_patterns("__pycache__"))
    host = PluginHost()
    host.load_all(directory)
    record = host.records[ALLCAPS]
    assert record.state == PluginState.LOADED, record.reason
    yield host, record.context
    host.stop()


def outbound() -> list[Message]:
    return list(Message.objects.filter(direction=Direction.OUT).order_by("pk"))


def test_all_twenty_capabilities_are_answered_and_the_admin_lists_only_the_others():
    assert TWENTY <= SUPPORTED


def test_the_example_plugin_declares_the_twenty_and_only_an_unanswered_one_is_listed(allcaps):
    host, _ = allcaps
    record = host.records[ALLCAPS]
    assert set(record.declared_capabilities) == TWENTY | {"send.video"}
    assert record.unsupported_capabilities == ["send.video"]


def test_sends_go_through_the_send_service_with_segments_adapters_accept(allcaps, make_session):
    host, ctx = allcaps
    session = make_session(user_id="4242", user_nickname="Alice")
    sid = session.session_id

    assert host.run(ctx.send.text("hello", sid), 10) is True
    assert host.run(ctx.send.image(PNG64, sid), 10) is True
    assert host.run(
        ctx.send.hybrid([{"type": "text", "content": "look:"}, {"type": "image", "content": PNG64}], sid), 10
    )
    nodes = [
        {"user_id": "10001", "nickname": "Alice", "segments": [{"type": "text", "content": "first"}]},
        {"user_id": "20002", "nickname": "Bob", "segments": [{"type": "image", "content": PNG64}]},
        {"user_id": "30003", "nickname": "Nobody", "segments": []},  # no content: left out, as in MaiBot
    ]
    assert host.run(ctx.send.forward(nodes, sid), 10) is True
    assert host.run(ctx.send.custom("music", {"type": "163", "id": "1901371647"}, sid), 10) is True
    assert host.run(ctx.send.custom("command", {"name": "SET_GROUP_BAN", "args": {"qq_id": 1}}, sid), 10) is True

    sent = outbound()
    assert [m.source_kind for m in sent] == ["reply"] * 6
    assert all(m.extra["plugin"] == ALLCAPS and m.delivery_status == "pending" for m in sent)
    assert [m.extra["capability"] for m in sent] == [
        "send.text", "send.image", "send.hybrid", "send.forward", "send.custom", "send.custom",
    ]  # fmt: skip
    # The image is stored once (the hybrid and the forward reuse it) and named by its hash.
    media = Media.objects.get()
    assert media.kind == "image" and media.mime == "image/png"
    assert sent[1].segments == [{"type": "image", "data": {"media": media.sha256}}]
    assert sent[1].text == "[image]"

    accept = ["text", "image", "emoji", "reply", "forward", "music", "command"]
    frames = [adapter_envelope(m, session, accept) for m in sent]
    assert all(error is None for _, error in frames)
    frames = [f for f, _ in frames]
    assert frames[0]["message_segment"] == {"type": "seglist", "data": [{"type": "text", "data": "hello"}]}
    assert frames[1]["message_segment"]["data"] == [{"type": "image", "data": PNG64}]
    assert frames[2]["message_segment"]["data"] == [{"type": "text", "data": "look:"}, {"type": "image", "data": PNG64}]
    # A forward: maim_message messages as nodes, the author in user_info, media as base64 inside.
    (forward,) = frames[3]["message_segment"]["data"]
    assert forward["type"] == "forward" and len(forward["data"]) == 2
    alice, bob = forward["data"]
    assert alice["message_info"]["user_info"]["user_id"] == 10001
    assert alice["message_info"]["user_info"]["user_nickname"] == "Alice"
    assert alice["message_segment"] == {"type": "seglist", "data": [{"type": "text", "data": "first"}]}
    assert bob["message_segment"]["data"] == [{"type": "image", "data": PNG64}]
    assert "Alice: first" in sent[3].text and "Bob: [image]" in sent[3].text
    assert frames[4]["message_segment"]["data"] == [{"type": "music", "data": {"type": "163", "id": "1901371647"}}]
    # A lone command goes out as the top-level segment, as the NapCat adapter reads commands.
    assert frames[5]["message_segment"] == {"type": "command", "data": {"name": "SET_GROUP_BAN", "args": {"qq_id": 1}}}
    # The node is what the NapCat adapter parses with maim_message's MessageBase.from_dict.
    from maim_message import MessageBase

    node = MessageBase.from_dict(bob)
    assert node.message_info.user_info.user_nickname == "Bob"
    assert node.message_segment.data[0].type == "image"


def test_return_details_without_an_echo_is_sent_with_no_platform_id_yet(allcaps, make_session, monkeypatch):
    from plugins.capabilities import send

    host, ctx = allcaps
    session = make_session()
    monkeypatch.setattr(send, "DETAILS_WAIT", 0.3)
    # No adapter, no echo: sent (it is in the outbox) but no platform id yet.
    assert host.run(ctx.send.text("hi", session.session_id, return_details=True), 10) == {
        "sent": True,
        "message_id": None,
    }
    assert host.run(ctx.send.text("", session.session_id, return_details=True), 10) == {
        "sent": False,
        "message_id": None,
    }


@pytest.mark.parametrize(
    ("capability", "args", "error"),
    [
        ("send.text", {"text": "x" * 10_001}, "longer than 10000"),
        ("send.text", {"text": "hi", "stream_id": "no-such-stream"}, "there is no chat with stream_id no-such-stream"),
        ("send.text", {"text": 42}, "needs text"),
        ("send.image", {"image_base64": "bm90IGFuIGltYWdl"}, "not an image"),
        ("send.image", {"image_base64": "%%%"}, "empty media payload"),
        ("send.image", {"image_base64": "A" * (MAX_MEDIA_BYTES * 2)}, "larger than"),
        ("send.image", {}, "needs base64 data"),
        ("send.custom", {"message_type": "bad type!", "content": {"a": 1}}, "must be a segment type"),
        ("send.custom", {"message_type": "music", "content": None}, "has no data"),
        ("send.custom", {"message_type": "card", "content": {"x": "y" * 300_000}}, "larger than"),
        ("send.custom", {"content": "x"}, "needs message_type"),
        ("send.forward", {"messages": []}, "non-empty list"),
        ("send.forward", {"messages": [{"nickname": "A", "segments": []}]}, "no node with content"),
        ("send.forward", {"messages": ["text"]}, "must be an object"),
        ("send.hybrid", {"segments": [{"type": "text", "content": ""}]}, "text is empty"),
        ("send.hybrid", {"segments": [{"type": "forward", "content": []}]}, "cannot be nested"),
        ("send.hybrid", {"segments": [{"type": "text", "content": "x"}] * 51}, "more than 50"),
        ("send.hybrid", {"segments": "text"}, "non-empty list"),
    ],
)
def test_unusable_send_arguments_are_error_results_and_nothing_is_sent(allcaps, make_session, capability, args, error):
    host, ctx = allcaps
    args = {"stream_id": make_session().session_id, **args}
    raw = host.run(ctx.call_host_method("cap.call", payload={"capability": capability, "args": args}), 10)
    assert raw["success"] is False and error in raw["error"]
    # What the plugin's own call gets: the SDK reduces a send's answer to a bool.
    assert host.run(ctx.call_capability(capability, **args), 10) is False
    assert outbound() == [] and Media.objects.count() == 0


def test_message_reads_by_id_recent_and_time_window(allcaps, make_session):
    host, ctx = allcaps
    session = make_session(user_id="777")
    sid = session.session_id
    now = datetime.now(UTC)
    old = inbound_store(session=session, text="last week", platform_message_id="pm-old")
    Message.objects.filter(pk=old.pk).update(time=now - timedelta(days=7))
    inbound_store(session=session, text="one", platform_message_id="pm-1")
    inbound_store(session=session, text="two", platform_message_id="pm-2")
    host.run(ctx.send.text("bot says", sid), 10)

    assert host.run(ctx.message.get_by_id("pm-1", chat_id=sid), 10)["processed_plain_text"] == "one"
    assert host.run(ctx.message.get_by_id("pm-1", chat_id="other"), 10) is None
    assert [m["processed_plain_text"] for m in host.run(ctx.message.get_recent(sid, limit=2), 10)] == [
        "two",
        "bot says",
    ]
    start, end = (now - timedelta(hours=1)).timestamp(), (now + timedelta(hours=1)).timestamp()
    window = host.run(ctx.message.get_by_time_in_chat(sid, str(start), str(end)), 10)
    assert [m["processed_plain_text"] for m in window] == ["one", "two", "bot says"]
    assert [m["is_bot_message"] for m in window] == [False, False, True]
    # MaiBot's options: limit keeps the latest (or the earliest), filter_mai leaves the bot out; ISO times.
    latest = host.run(ctx.message.get_by_time_in_chat(sid, str(start), str(end), limit=2), 10)
    assert [m["processed_plain_text"] for m in latest] == ["two", "bot says"]
    earliest = host.run(ctx.message.get_by_time_in_chat(sid, str(start), str(end), limit=1, limit_mode="earliest"), 10)
    assert [m["processed_plain_text"] for m in earliest] == ["one"]
    humans = host.run(
        ctx.message.get_by_time_in_chat(sid, (now - timedelta(days=8)).isoformat(), end, filter_mai=True), 10
    )
    assert [m["processed_plain_text"] for m in humans] == ["last week", "one", "two"]
    for start_time, problem in [("yesterday", "neither a Unix timestamp"), ("2026-01-01T00:00:00", "UTC offset")]:
        args = {"chat_id": sid, "start_time": start_time, "end_time": end}
        payload = {"capability": "message.get_by_time_in_chat", "args": args}
        raw = host.run(ctx.call_host_method("cap.call", payload=payload), 10)
        assert raw["success"] is False and problem in raw["error"]


def test_streams_map_to_sessions_and_open_session_creates_a_chat_once(allcaps, make_session):
    host, ctx = allcaps
    private = make_session(user_id="4242")
    opened = host.run(ctx.chat.open_session("qq", "group", group_id="9090"), 10)
    assert opened["success"] and opened["created"] is True
    session = ChatSession.objects.get(session_id=opened["stream_id"])
    assert (session.chat_type, session.group_id, session.platform) == ("group", "9090", "qq")
    assert opened["stream"] == {k: opened[k] for k in opened["stream"]}
    again = host.run(ctx.chat.open_session(chat_type="group", group_id="9090"), 10)
    assert again["created"] is False and again["stream_id"] == opened["stream_id"]
    assert host.run(ctx.chat.open_session("qq", "private", user_id="4242"), 10)["stream_id"] == private.session_id

    assert host.run(ctx.chat.get_stream_by_group_id("9090"), 10)["stream_id"] == opened["stream_id"]
    assert host.run(ctx.chat.get_stream_by_user_id("4242"), 10)["stream_id"] == private.session_id
    assert [s["group_id"] for s in host.run(ctx.chat.get_group_streams(), 10)] == ["9090"]
    assert {s["stream_id"] for s in host.run(ctx.chat.get_all_streams(), 10)} == {
        private.session_id,
        opened["stream_id"],
    }
    assert host.run(ctx.chat.get_all_streams(platform="telegram"), 10) == []

    missing = host.run(ctx.chat.open_session("qq", "group"), 10)
    assert missing == {"success": False, "error": "a group chat needs group_id"}
    assert "not a valid id" in host.run(ctx.chat.open_session("qq", "private", user_id="x" * 200), 10)["error"]
    assert ChatSession.objects.count() == 2


def test_config_never_answers_secrets_even_in_a_whole_section(allcaps):
    host, ctx = allcaps
    assert host.run(ctx.config.get("bot.nickname"), 10) == "麦麦"
    llm_section = host.run(ctx.config.get("llm"), 10)
    assert isinstance(llm_section, dict) and "model" in llm_section
    assert not any("api_key" in key for key in llm_section)
    assert host.run(ctx.config.get("llm.api_key_env", "hidden"), 10) == "hidden"


def test_llm_generate_and_available_models_use_our_client_routing_and_ledger(allcaps):
    host, ctx = allcaps
    with (
        FakeLLM() as fake,
        config.override(llm={"base_url": fake.base_url, "model": "fake-model", "max_retries": 0}),
    ):
        fake.script(fake.text("Teal is calm."))
        assert host.run(ctx.llm.get_available_models(), 10) == ["utility"]
        answer = host.run(
            ctx.llm.generate([{"role": "system", "content": "be brief"}, {"role": "user", "content": "teal?"}]), 10
        )
        assert answer["success"] is True and answer["response"] == "Teal is calm." and answer["model"] == "default"
        assert fake.requests[0]["messages"] == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "teal?"},
        ]
        bad = host.run(ctx.llm.generate([{"role": "tool", "content": "x"}]), 10)
        assert bad["success"] is False and "role" in bad["error"]
    ledger = LLMCall.objects.get()
    assert ledger.purpose == f"plugin:{ALLCAPS}"[:32] and ledger.task == "utility"
    # No model configured (offline): no task to name.
    assert get_config().offline and host.run(ctx.llm.get_available_models(), 10) == []


def test_api_call_reaches_a_public_api_and_says_why_when_it_cannot(allcaps):
    host, ctx = allcaps
    assert host.run(ctx.api.call("test.maibot.allcaps.echo", text="ping"), 10) == {"echo": "PING"}
    assert host.run(ctx.api.call("echo", text="short"), 10) == {"echo": "SHORT"}  # a unique short name
    missing = host.run(ctx.api.call("test.maibot.nobody.nothing"), 10)
    assert missing["success"] is False and "no API test.maibot.nobody.nothing" in missing["error"]
    bad = host.run(ctx.call_capability("api.call", api_name="echo", args=["not", "a", "dict"]), 10)
    assert bad["success"] is False and "must be an object" in bad["error"]


def test_context_append_reaches_the_next_prompt_once_and_proactive_needs_a_runtime(allcaps, make_session):
    host, ctx = allcaps
    session = make_session()
    sid = session.session_id
    appended = host.run(ctx.maisaka.context.append(sid, [{"type": "text", "content": "Favourite colour: teal."}]), 10)
    assert appended["success"] is True and appended["visible_text"] == "Favourite colour: teal."
    image = host.run(ctx.maisaka.context.append(sid, [{"type": "image", "content": PNG64, "description": "a cat"}]), 10)
    assert image["visible_text"] == "[image: a cat]"
    assert host.run(ctx.maisaka.context.append(sid, []), 10)["success"] is False
    assert "no chat" in host.run(ctx.maisaka.context.append("nope", [{"type": "text", "content": "x"}]), 10)["error"]

    # No runtime loop in this process (no inbound message served): said so, the request kept for the prompt.
    triggered = host.run(ctx.maisaka.proactive.trigger(sid, "say something about teal", reason="it is Friday"), 10)
    assert triggered["success"] is False and "no chat runtime runs in this process yet" in triggered["error"]
    assert host.run(ctx.maisaka.proactive.trigger(sid, ""), 10)["error"] == "maisaka.proactive.trigger needs intent"

    blocks = dict(context_blocks(session))
    text = blocks[maisaka.CONTEXT_BLOCK]
    assert f"- from plugin {ALLCAPS}: Favourite colour: teal." in text
    assert f"- from plugin {ALLCAPS}: [image: a cat]" in text
    assert f"- plugin {ALLCAPS} asks you to act: say something about teal (reason: it is Friday)" in text
    assert maisaka.CONTEXT_BLOCK not in dict(context_blocks(session))  # shown once
    assert "a plugin asked you to take a turn" in instruction("proactive", private=True, mentioned=False)


def test_pending_plugin_context_is_bounded_and_expires():
    for i in range(maisaka.MAX_ENTRIES + 5):
        maisaka._add("s-bounded", maisaka.Entry("p", "context", f"entry {i}", at=1000.0 + i))
    entries = maisaka.take("s-bounded", now=1000.0 + maisaka.MAX_ENTRIES + 5)
    assert entries[0].text == "entry 5" and len(entries) == maisaka.MAX_ENTRIES
    maisaka._add("s-old", maisaka.Entry("p", "context", "stale", at=0.0))
    assert maisaka.take("s-old", now=maisaka.ENTRY_TTL + 1) == []


@pytest.mark.browser
def test_render_html2png_with_real_chromium_is_bounded(allcaps):
    require_chromium()
    host, ctx = allcaps
    # One page (each render starts a browser: seconds on a loaded machine). The card is shot by its
    # selector; its width says whether the page could read a local file: 120 px when the load of
    # file:///etc/hostname failed (no file://, no network unless allowed), 60 px had it succeeded.
    page = (
        "<div id='card' style='width:10px;height:40px;background:rgb(0,128,128)'>teal</div>"
        "<img src='file:///etc/hostname' "
        "onerror=\"card.style.width='120px'; document.body.dataset.done='1'\" "
        "onload=\"card.style.width='60px'; document.body.dataset.done='1'\">"
    )
    shot = ctx.render.html2png(page, selector="#card", device_scale_factor=1, wait_for_selector="body[data-done]")
    result = host.run(shot, 60)
    assert result["mime_type"] == "image/png" and (result["width"], result["height"]) == (120, 40)
    data = base64.b64decode(result["image_base64"])
    assert data.startswith(b"\x89PNG") and struct.unpack(">II", data[16:24]) == (120, 40)
    assert isinstance(result["render_ms"], int) and result["render_ms"] > 0

    for kwargs, problem in [
        ({"html": ""}, "needs html"),
        ({"html": "x" * (2 * 1024 * 1024 + 1)}, "longer than"),
        ({"html": "x", "viewport": {"width": 10_000, "height": 10}}, "width must be between"),
        ({"html": "x", "device_scale_factor": 50}, "device_scale_factor must be between"),
        ({"html": "x", "wait_until": "forever"}, "wait_until is one of"),
        ({"html": "x", "render_timeout_ms": 10**9}, "between 1 and 60000"),
    ]:
        html = kwargs.pop("html")
        raw = host.run(ctx.render.html2png(html, **kwargs), 60)
        assert raw["success"] is False and problem in raw["error"], raw


def test_the_twenty_most_declared_capabilities_of_the_public_index_are_answered():
    # bench/data/plugin_index_manifests.json: manifest fields of MaiBot's public plugin index (a
    # snapshot; bench/plugin_index.py prints the figures).
    import json
    from collections import Counter

    path = Path(__file__).resolve().parents[2] / "bench" / "data" / "plugin_index_manifests.json"
    manifests = [e["manifest"] for e in json.loads(path.read_text())["entries"]]
    declared = Counter(c for m in manifests if m.get("manifest_version") == 2 for c in set(m["capabilities"]))
    top = [c for c, _ in declared.most_common(20)]
    assert set(top) == TWENTY
    assert set(top) <= SUPPORTED


async def test_proactive_trigger_gives_the_chat_a_planner_turn_live_or_not(allcaps, fake_llm, runtimes, make_session):
    from asgiref.sync import sync_to_async

    from chat.models import PlannerCycle
    from tests.chat.planner_helpers import say, settled
    from tests.conftest import wait_for_async

    host, ctx = allcaps
    live = await sync_to_async(make_session)(user_id="5151")
    idle = await sync_to_async(make_session)(user_id="6161")
    await sync_to_async(inbound_store)(session=idle, text="an old message, already answered")
    fake_llm.default = lambda body: fake_llm.tool_call("no_reply", {"reason": "nothing to add"})
    await say(live, "hello")  # binds the process's runtimes to this loop; live's runtime starts
    await settled(runtimes, live)
    assert runtimes.get(idle.pk) is None

    async def trigger(session, intent: str) -> dict:
        return await asyncio.to_thread(host.run, ctx.maisaka.proactive.trigger(session.session_id, intent), 10)

    fake_llm.script(
        fake_llm.tool_call("reply", {"text": "Teal, then."}), fake_llm.tool_call("reply", {"text": "Hi again!"})
    )
    assert (await trigger(live, "suggest a colour"))["success"] is True
    assert (await trigger(idle, "say hi again"))["success"] is True

    async def proactive_cycles() -> list:
        rows = PlannerCycle.objects.filter(trigger="proactive", ended_at__isnull=False)
        return [c async for c in rows.order_by("pk")]

    found = []

    async def two() -> bool:
        found[:] = await proactive_cycles()
        return len(found) == 2

    await wait_for_async(two, timeout=30, what="a proactive turn in each chat")
    assert {c.session_id for c in found} == {live.pk, idle.pk}
    prompts = [r["messages"][1]["content"] for r in fake_llm.requests[-2:]]
    assert all("a plugin asked you to take a turn" in p for p in prompts)
    assert any(f"plugin {ALLCAPS} asks you to act: suggest a colour" in p for p in prompts)
    assert any(f"plugin {ALLCAPS} asks you to act: say hi again" in p for p in prompts)
    # The idle chat's runtime started with its old message taken as seen: no cycle about it.
    assert await PlannerCycle.objects.filter(session=idle).acount() == 1


def test_send_emoji_and_build_readable_beyond_the_twenty(allcaps, make_session):
    host, ctx = allcaps
    session = make_session(user_id="8080", user_nickname="Alice")
    sid = session.session_id
    # Declared by the manifest's neighbours in the index; called here through the raw capability call.
    record = host.records[ALLCAPS]
    record.manifest.capabilities.extend(["send.emoji", "message.build_readable"])
    assert host.run(ctx.send.emoji(PNG64, sid), 10) is True
    (sent,) = outbound()
    assert sent.segments[0]["type"] == "emoji" and sent.text == "[emoji]"
    frame, _ = adapter_envelope(sent, session, ["text", "emoji"])
    assert frame["message_segment"]["data"] == [{"type": "emoji", "data": PNG64}]

    inbound_store(session=session, text="麦麦, what is teal?", sender_nickname="Alice")
    messages = host.run(ctx.message.get_recent(sid, limit=5), 10)
    text = host.run(ctx.message.build_readable(messages, timestamp_mode="relative"), 10)
    assert text.splitlines() == ["[刚刚] 麦麦说：[emoji]", "[刚刚] Alice说：你, what is teal?"]
    by_chat = host.run(ctx.call_capability("message.build_readable", chat_id=sid, timestamp_mode="normal_no_ymd"), 10)
    assert len(by_chat.splitlines()) == 2 and by_chat.splitlines()[1].endswith("Alice说：你, what is teal?")
    bad = host.run(ctx.message.build_readable("not a list"), 10)
    assert bad["success"] is False and "must be a list" in bad["error"]
