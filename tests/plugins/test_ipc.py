"""Frames far above a pipe's 64 KiB between the host and a real runner, both ways, with the example
plugin `bigframes` (real maibot-plugin-sdk): chat messages of 70,000 and 1,000,000 characters reach
its hook and its command whole (their SHA-256 compared), its tool answers 1 MB and 5 MB results
whole, a large render reaches it and comes back, a 200 KB and a 1 MB config.toml are edited from the
console, and an answer too big for any frame fails the call instead of leaving the plugin waiting.
A runner that read a frame with one read() got at most 64 KiB of it and died."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User

from chat.agent.engine import AgentTurn
from chat.agent.llm import ToolCallRequest
from chat.models import CycleKind, Direction, Message
from plugins import host as plugin_host
from plugins import ipc
from plugins.host import PluginHost
from plugins.plugin_apis import call_api
from tests.chat.planner_helpers import fake_llm_fixture, inbound_store, runtimes_fixture, say  # noqa: F401
from tests.conftest import require_chromium, wait_for_async
from tests.plugins.conftest import load_ipc_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

BIG = "test.maibot.bigframes"
PIPE_BYTES = 64 * 1024


def fingerprint(text: str) -> dict:
    return {"length": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def filler(size: int) -> str:
    """The plugin's own filler (ASCII and multi-byte characters), written again here to check it."""
    unit = "frame 帧 🧩 "
    return (unit * (size // len(unit) + 1))[:size]


@pytest.fixture
def bigframes(tmp_path):
    host = load_ipc_plugins(tmp_path / "plugins", "bigframes")
    assert host.records[BIG].state == "loaded", host.records[BIG].reason
    yield host
    host.stop()


def api(host: PluginHost, name: str, **args):
    record = host.records[BIG]
    return asyncio.run(call_api(record, BIG, name, args, 60.0))


async def test_messages_of_70_000_and_1_000_000_characters_reach_the_hook_and_the_command_whole(
    bigframes, fake_llm, runtimes, make_session
):
    record = bigframes.records[BIG]
    pid = record.runner_pid
    session = await sync_to_async(make_session)()
    expected = []
    for size in (70_000, 1_000_000):
        body = filler(size - 1) + "!"  # the typed text is stripped: no space at its end
        text = "/fingerprint " + body
        assert len(text.encode("utf-8")) > PIPE_BYTES
        await say(session, text)
        expected += [{"where": "hook", **fingerprint(text)}, {"where": "command", **fingerprint(body)}]
        reply = f"fingerprint {size} {fingerprint(body)['sha256']}"

        def answered(reply=reply) -> bool:
            return Message.objects.filter(session=session, direction=Direction.OUT, text=reply).exists()

        # The command says what it saw in the chat: the plugin had the message whole.
        await wait_for_async(answered, timeout=60, what=f"the plugin's fingerprint of {size} characters")
    assert await sync_to_async(api)(bigframes, "seen") == expected
    assert fake_llm.requests == []  # the command intercepted both: no model call
    assert record.runner_pid == pid and record.restarts == 0 and record.errors == 0


def test_a_tool_answers_results_of_one_and_five_megabytes_whole(bigframes, make_session):
    record = bigframes.records[BIG]
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=make_session(), trigger="test")
    arguments = {"size": 1_000_000}
    request = ToolCallRequest(
        id="call_big", name="big_answer", raw_arguments=json.dumps(arguments), arguments=arguments
    )
    result = turn.execute([request])[0].result
    assert result["ok"], result
    answer = result["result"]
    said = {"length": answer["length"], "sha256": answer["sha256"]}  # what the plugin sent
    assert fingerprint(answer["content"]) == fingerprint(filler(1_000_000)) == said
    component = next(c for c in record.components if c.name == "big_answer")
    answer = bigframes.invoke(record, component, {"size": 5_000_000}, 60)
    assert len(json.dumps(answer, ensure_ascii=False).encode("utf-8")) > 7_000_000
    assert fingerprint(answer["content"]) == fingerprint(filler(5_000_000))
    assert record.restarts == 0 and record.errors == 0


def test_a_large_render_reaches_the_plugin_and_comes_back_whole(bigframes):
    require_chromium()
    record = bigframes.records[BIG]
    pid = record.runner_pid
    png_b64 = api(bigframes, "render_noise", side=400)
    assert (png_b64["width"], png_b64["height"]) == (400, 400)
    png = base64.b64decode(png_b64["image_base64"], validate=True)
    assert len(png) > 4 * PIPE_BYTES  # a noisy canvas does not compress
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and struct.unpack(">II", png[16:24]) == (400, 400)
    assert png.endswith(b"IEND\xaeB`\x82")  # whole, to its last chunk
    assert record.runner_pid == pid and record.restarts == 0


def test_an_answer_too_big_for_a_frame_fails_the_plugins_call_at_once(bigframes, make_session, monkeypatch):
    session = make_session()
    inbound_store(session=session, text=filler(300_000))
    # The host sends no frame above this (the runner's own limit is unchanged): the answer does not fit.
    monkeypatch.setattr(ipc, "MAX_FRAME", 256 * 1024)
    outcome = api(bigframes, "recent", stream_id=session.session_id)
    assert outcome["error"].startswith("RuntimeError: frame of "), outcome
    assert "is larger than 262144" in outcome["error"]
    monkeypatch.undo()
    assert api(bigframes, "recent", stream_id=session.session_id)["messages"] == [fingerprint(filler(300_000))]


def notes_config(lines: int, line: str) -> str:
    items = ",\n".join(json.dumps(f"{n:06d} {line}", ensure_ascii=False) for n in range(lines))
    return f'[plugin]\nconfig_version = "1.0.0"\nenabled = true\n\n[notes]\nlines = [\n{items},\n]\n'


def test_a_config_of_200_kb_and_one_of_1_mb_are_edited_from_the_console(bigframes, client, monkeypatch):
    monkeypatch.setattr(plugin_host, "host", bigframes)
    record = bigframes.records[BIG]
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = f"/admin/plugins/{BIG}/config/"
    line = "a note that makes the config long, with 汉字 and emoji 🧩 in it"
    for lines, size in ((2_800, 200_000), (13_000, 1_000_000)):
        text = notes_config(lines, line)
        assert size < len(text.encode("utf-8")) <= plugin_host.MAX_CONFIG_BYTES
        response = client.post(url, {"toml": text})  # multipart, as the form posts
        assert response.status_code == 302, response.content.decode()[:2000]
        assert (record.folder / "config.toml").read_text(encoding="utf-8") == text
        assert api(bigframes, "notes") == {
            "count": lines,
            **fingerprint("\n".join(f"{n:06d} {line}" for n in range(lines))),
        }
        assert record.state == "loaded" and record.reload_error == ""

    before = (record.folder / "config.toml").read_text(encoding="utf-8")
    too_big = notes_config(16_000, line)
    assert len(too_big.encode("utf-8")) > plugin_host.MAX_CONFIG_BYTES
    page = client.post(url, {"toml": too_big}).content.decode()
    assert f"config.toml is larger than {plugin_host.MAX_CONFIG_BYTES} bytes" in page
    assert (record.folder / "config.toml").read_text(encoding="utf-8") == before
    # The browser posts the text as it is (URL-encoding would make 1 MB of it up to 9 MB, past Django's
    # DATA_UPLOAD_MAX_MEMORY_SIZE), and the editor shows the config in force.
    page = client.get(url).content.decode()
    assert 'enctype="multipart/form-data"' in page and "013000 a note" not in page and "012999 a note" in page
