"""Adapter plugins end to end: a live daphne loads the NapCat adapter plugin stand-in (tests/plugins/
adapter_fixtures/napcat_standin, behaving on the wire as the official maibot-team.napcat-adapter 1.4.0) from
its data dir, configured by its own config.toml to dial the NapCat stand-in (tests/plugins/napcat_onebot.py,
behaving as NapCat's forward WebSocket server) on this machine. A private "ping" and a group @-mention are
answered through it, a reminder from the task cluster is delivered through it and marked delivered from the
gateway's result, a NapCat restart loses nothing, a NapCat refusal is retried then failed with its reason,
and a wrong NapCat token keeps the gateway down. The attacker's side (a plugin that is not an adapter, a
gateway speaking for another platform, forged and oversized messages) is test_adapter_plugins_attacks.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from chat.models import AdapterConnection, Message
from chat.services import message_send
from scheduling.models import ScheduledMessage
from scheduling.services import SYSTEM, scheduled_message_create
from tests.chat.gateway_helpers import write_bot_config
from tests.conftest import db, wait_for_async
from tests.fake_llm import FakeLLM
from tests.plugins.napcat_onebot import NapCatOneBot, at, image, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

STANDIN = Path(__file__).resolve().parent / "adapter_fixtures" / "napcat_standin"
PLUGIN_ID = "test.maibot.napcat-standin"
NAPCAT_TOKEN = "napcat-access-token"
BOT_QQ = 3_000_000_001
# Short confirm windows: a refused row is handed over again after 1 s, failed after its 2nd refusal.
BOT_CONFIG = '[bot]\nnickname = "小麦"\n[gateway]\nconfirm_seconds = 1.0\nmax_delivery_attempts = 2\n'


def install_standin(data_dir: Path, napcat: NapCatOneBot, *, token: str = NAPCAT_TOKEN) -> None:
    """The stand-in plugin in the data dir's plugins/, with the config.toml an operator writes."""
    folder = data_dir / "plugins" / "napcat_adapter"
    shutil.copytree(STANDIN, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "config.toml").write_text(
        '[plugin]\nenabled = true\nconfig_version = "0.1.0"\n\n'
        f'[napcat_server]\nhost = "127.0.0.1"\nport = {napcat.port}\ntoken = "{token}"\n'
        "heartbeat_interval = 30\nreconnect_delay_sec = 0.5\naction_timeout_sec = 5\n",
        encoding="utf-8",
    )
    write_bot_config(data_dir, BOT_CONFIG)


def healthz(base: str) -> dict:
    """/healthz's JSON, whatever its status (503 here: no task cluster runs)."""
    try:
        with urllib.request.urlopen(f"{base}/healthz") as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def start(start_server, tmp_path: Path, napcat: NapCatOneBot, fake: FakeLLM | None = None, **kw):
    install_standin(tmp_path / "data-web", napcat, **kw)
    env = {"MAIBOT_PLUGIN_HOST_NETWORK": PLUGIN_ID}  # NapCat listens on this machine's loopback
    if fake is not None:
        env.update(OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model")
    return start_server(**env)


async def gateway_up(timeout: float = 30) -> AdapterConnection:
    def up():
        return AdapterConnection.objects.filter(platform="qq", protocol="plugin", disconnected_at__isnull=True).first()

    return await wait_for_async(up, timeout=timeout, what="the NapCat gateway to report itself ready")


async def sent_to(napcat: NapCatOneBot, count: int, timeout: float = 30):
    async def enough():
        return napcat.sent if len(napcat.sent) >= count else None

    return await wait_for_async(enough, timeout=timeout, what=f"{count} messages sent through NapCat")


async def test_private_ping_and_group_mention_are_answered_through_the_adapter_plugin(start_server, tmp_path):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    napcat.members[("555", str(BOT_QQ))] = {"user_id": BOT_QQ, "nickname": "小麦", "card": "麦麦"}
    with FakeLLM() as fake:
        fake.script(fake.tool_call("reply", {"text": "pong"}), fake.tool_call("reply", {"text": "群里好"}))
        proc, base = start(start_server, tmp_path, napcat, fake)
        try:
            conn = await gateway_up()
            assert conn.remote.startswith(f"plugin {PLUGIN_ID}/napcat_gateway")
            assert ("get_login_info", {}) in napcat.actions
            # Its optional tool, declared enabled=False and switched off again by the plugin at load.
            await asyncio.to_thread(proc.wait_for_output, "NapCat 主动私聊工具启停: {'success': True}", 30)

            ping_id = await napcat.private_message(10001, "ping", nickname="Alice")
            (sent,) = await sent_to(napcat, 1)
            assert (sent.action, sent.target, sent.text()) == ("send_private_msg", "10001", "pong")
            assert "open_private_chat" not in [t["function"]["name"] for t in fake.requests[0]["tools"]]
            inbound = await db(lambda: Message.objects.select_related("session").get(platform_message_id=str(ping_id)))
            assert inbound.text == "ping" and inbound.session.platform == "qq" and inbound.sender_nickname == "Alice"
            reply = await wait_for_async(
                lambda: Message.objects.filter(direction="out", text="pong", delivery_status="delivered").first(),
                what="the reply marked delivered from the gateway's result",
            )
            assert reply.platform_message_id == str(sent.message_id)

            await napcat.group_message(555, 10002, [at(BOT_QQ), text(" 在吗")], nickname="Bob")
            _, group_sent = await sent_to(napcat, 2)
            assert (group_sent.action, group_sent.target, group_sent.text()) == ("send_group_msg", "555", "群里好")
            mention = await db(lambda: Message.objects.get(direction="in", session__group_id="555"))
            assert mention.text == f"@<麦麦:{BOT_QQ}> 在吗" and mention.extra["mentioned"] is True
            assert "get_group_member_info" in [a for a, _ in napcat.actions]

            # The dashboard's and /healthz's view of the adapter: a plugin, the bot's QQ account.
            health = await asyncio.to_thread(healthz, base)
            assert {"platform": "qq", "protocol": "plugin", "account": str(BOT_QQ)} in health["checks"]["adapters"][
                "connections"
            ]
        finally:
            await napcat.stop()


async def test_an_inbound_image_is_stored_as_media(start_server, tmp_path):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    start(start_server, tmp_path, napcat)
    try:
        await gateway_up()
        url = f"http://127.0.0.1:{napcat.port}/img/cat.png"
        await napcat.private_message(10003, [text("看"), image(url)], nickname="Carol")
        stored = await wait_for_async(
            lambda: Message.objects.filter(direction="in", session__user_id="10003").first(), what="the image stored"
        )
        assert stored.segments[0] == {"type": "text", "data": "看"}
        assert stored.segments[1]["type"] == "image" and len(stored.segments[1]["data"]["media"]) == 64
    finally:
        await napcat.stop()


async def test_a_reminder_is_delivered_through_the_gateway_and_marked_delivered(
    start_server, start_qcluster, tmp_path, make_session
):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    start(start_server, tmp_path, napcat)
    start_qcluster()
    try:
        await gateway_up()
        session = await db(make_session, user_id="10004", user_nickname="Dan")
        due = timezone.now() + timedelta(seconds=2)
        args = {"session": session, "send_at": due, "message_text": "喝水提醒", "acted_by": SYSTEM}
        task = (await db(scheduled_message_create, **args)).task
        (sent,) = await sent_to(napcat, 1)
        assert (sent.action, sent.target, sent.text()) == ("send_private_msg", "10004", "喝水提醒")
        row = await wait_for_async(
            lambda: ScheduledMessage.objects.select_related("sent_message").get(pk=task.pk).sent_message,
            what="the reminder sent",
        )
        delivered = await wait_for_async(
            lambda: Message.objects.filter(pk=row.pk, delivery_status="delivered").first(), what="it delivered"
        )
        assert delivered.platform_message_id == str(sent.message_id) and delivered.source_kind == "scheduled_send"
    finally:
        await napcat.stop()


async def test_a_napcat_restart_loses_nothing(start_server, tmp_path, make_session):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    proc, _ = start(start_server, tmp_path, napcat)
    try:
        await gateway_up()
        # The plugin reports `ready: false` on a disconnect only once it has its ready report's answer
        # (as the official plugin): until then NapCat going away would leave the gateway up.
        await asyncio.to_thread(proc.wait_for_output, "NapCat 消息网关已激活路由", 30)
        session = await db(make_session, user_id="10005", user_nickname="Eve")
        await napcat.stop()  # NapCat goes away: the plugin reports its gateway not ready
        await wait_for_async(
            lambda: not AdapterConnection.objects.filter(protocol="plugin", disconnected_at__isnull=True).exists(),
            what="the gateway reported down",
        )
        rows = [await db(message_send, session=session, source_kind="proactive", text=f"消息 {i}") for i in range(3)]
        await napcat.start()  # back on the same port: the plugin reconnects by itself
        sent = await sent_to(napcat, 3)
        assert sorted(s.text() for s in sent) == ["消息 0", "消息 1", "消息 2"]
        ids = [r.pk for r in rows]
        await wait_for_async(
            lambda: Message.objects.filter(pk__in=ids, delivery_status="delivered").count() == 3,
            what="all three delivered",
        )
        assert len(napcat.sent) == 3  # each once
    finally:
        await napcat.stop()


async def test_a_refusal_by_napcat_is_retried_then_fails_with_its_reason(start_server, tmp_path, make_session):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    napcat.refuse["send_private_msg"] = "消息发送失败，请检查是否为好友"
    start(start_server, tmp_path, napcat)
    try:
        await gateway_up()
        session = await db(make_session, user_id="10006", user_nickname="Fay")
        row = await db(message_send, session=session, source_kind="proactive", text="你好")
        retried = await wait_for_async(
            lambda: (
                Message.objects.filter(pk=row.pk, delivery_status="pending", delivery_attempts=1)
                .exclude(delivery_error="")
                .first()
            ),
            what="the refused row waiting for its retry",
        )
        assert retried.delivery_error == "gateway_failed: 消息发送失败，请检查是否为好友"
        failed = await wait_for_async(
            lambda: Message.objects.filter(pk=row.pk, delivery_status="failed").first(), what="it failed"
        )
        assert failed.delivery_error == retried.delivery_error and failed.delivery_attempts == 2
        assert [a for a, _ in napcat.actions].count("send_private_msg") == 2 and napcat.sent == []
    finally:
        await napcat.stop()


async def test_a_wrong_napcat_token_keeps_the_gateway_down(start_server, tmp_path):
    napcat = await NapCatOneBot(self_id=BOT_QQ, token=NAPCAT_TOKEN).start()
    proc, _ = start(start_server, tmp_path, napcat, token="not-the-token")
    try:

        async def refused_twice():
            return napcat.refused_tokens >= 2  # refused (1403 + close), and the plugin dialled again

        await wait_for_async(refused_twice, what="NapCat refusing the plugin's token, twice")
        assert not await db(lambda: AdapterConnection.objects.filter(protocol="plugin").exists())
        assert "NapCat 适配器连接已断开" in proc.output() or "NapCat 适配器连接失败" in proc.output()
    finally:
        await napcat.stop()
