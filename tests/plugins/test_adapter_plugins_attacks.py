"""The gateway host methods through a live daphne and the real plugin host. The attacker's side: a plugin
that is not an adapter declares a message gateway and calls the gateway host methods; an adapter plugin's
gateway (declared for `qqforge`) tries to speak for another platform, to route before it is ready, forged,
oversized and duplicate messages, and a gateway it does not declare. Each is refused with its reason (the
plugins print what their calls answered), nothing of it is stored, and the one legitimate message is.
And the route types: a receive-only and a send-only gateway sharing one platform."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from chat.models import AdapterConnection, Message
from chat.services import message_send
from tests.conftest import db, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

FIXTURES = Path(__file__).resolve().parent / "adapter_fixtures"


def outcomes(log: str, who: str) -> dict[str, str]:
    """{case: "ok …" | "error …"} from the lines the plugin printed (the host logs its stderr)."""
    found = {}
    for line in log.splitlines():
        if match := re.search(rf" {who} ([a-z_]+): (.*)$", line):
            found[match[1]] = match[2].strip()
    return found


async def test_gateway_host_methods_refuse_what_a_plugin_may_not_do(start_server, tmp_path):
    plugins = tmp_path / "data-web" / "plugins"
    for name in ("forger", "impostor"):
        shutil.copytree(FIXTURES / name, plugins / name)
    proc, _ = start_server()
    await asyncio.to_thread(proc.wait_for_output, "forger done", 60)
    await asyncio.to_thread(proc.wait_for_output, "impostor done", 30)
    log = proc.output()

    # Not an adapter: its gateway component is not registered, and it may not call the gateway methods.
    assert "MESSAGE_GATEWAY qq_gateway (skipped: message gateways are for adapter plugins" in log
    impostor = outcomes(log, "impostor")
    assert impostor["state"].startswith("error host.update_message_gateway_state: plugin test.maibot.impostor")
    assert "declares no message gateway qq_gateway" in impostor["route"]
    assert "declares no message gateway (unnamed)" in impostor["raw_route"]

    forger = outcomes(log, "forger")
    assert "gateway forged_gateway is not ready" in forger["route_before_ready"]
    assert "declared for platform qqforge, not qq" in forger["state_other_platform"]
    assert "declared for platform qqforge, not web" in forger["state_web"]
    assert forger["state"] == "ok True"
    assert "message for platform qq, not the gateway's qqforge" in forger["route_other_platform"]
    assert "malformed" in forger["route_forged"] or "message_info.user_info.user_id" in forger["route_forged"]
    assert "bytes (at most 25165824)" in forger["route_oversized"]
    assert "is larger than 33554432" in forger["route_beyond_a_frame"]  # refused in its runner, at once
    assert "declares no message gateway other_gateway" in forger["route_undeclared_gateway"]
    assert forger["route_good"] == "ok True"
    assert forger["route_duplicate"] == "ok False"

    def stored() -> list[tuple[str, str]]:
        return list(Message.objects.filter(direction="in").values_list("session__platform", "text"))

    # An accepted message is stored by the ingest batch after the answer: wait for it, then for nothing else.
    await wait_for_async(stored, what="the accepted message stored")
    assert await db(stored) == [("qqforge", "合法消息")]
    assert not await db(lambda: AdapterConnection.objects.filter(platform="qq").exists())
    assert await db(lambda: AdapterConnection.objects.filter(platform="qqforge", protocol="plugin").exists())


async def test_a_receive_only_and_a_send_only_gateway_share_a_platform(start_server, tmp_path, make_session):
    shutil.copytree(FIXTURES / "splitgate", tmp_path / "data-web" / "plugins" / "splitgate")
    proc, _ = start_server()
    await asyncio.to_thread(proc.wait_for_output, "splitgate done", 60)
    split = outcomes(proc.output(), "splitgate")
    assert split["inbound_ready"] == split["outbound_ready"] == "ok True"
    assert split["route_inbound"] == "ok True"
    assert "gateway outbound is declared send-only" in split["route_outbound"]

    # Accepted means queued for storage (chat.gateway.plugin_adapters): the row comes a moment later.
    stored = await wait_for_async(
        lambda: list(Message.objects.filter(direction="in").values_list("session__platform", "text")),
        what="the routed message stored",
    )
    assert stored == [("qqsplit", "经接收网关")]
    # Only the sending gateway is the platform's connection; outbound rows go to it, and its answer is their fate.
    (conn,) = await db(lambda: list(AdapterConnection.objects.filter(platform="qqsplit", disconnected_at__isnull=True)))
    assert conn.protocol == "plugin" and conn.remote == "plugin test.maibot.splitgate/outbound"
    session = await db(make_session, platform="qqsplit", user_id="5151")
    row = await db(message_send, session=session, source_kind="proactive", text="回信")
    delivered = await wait_for_async(
        lambda: Message.objects.filter(pk=row.pk, delivery_status="delivered").first(), what="delivered by 'outbound'"
    )
    assert delivered.platform_message_id == f"out-{row.uid}"
