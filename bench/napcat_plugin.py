"""Run an adapter plugin (meant for the UNMODIFIED official NapCat adapter plugin, Mai-with-u/
MaiBot-Napcat-Adapter branch main) from a folder against the NapCat stand-in, and print what happened.

The folder is copied into a fresh data dir's plugins/ with the config.toml an operator writes (enabled,
NapCat's host/port/token, a whitelist of the chats used here); a real daphne (with the plugin's runner
allowed this machine's loopback, MAIBOT_PLUGIN_HOST_NETWORK) and a real `manage.py qcluster` run against a
fresh database, the bot's model is tests/fake_llm.py, and NapCat is tests/plugins/napcat_onebot.py (its
forward WebSocket server as NapCatQQ behaves). Then, each step printed with what NapCat got and what the
database says:
  1. the gateway reports itself ready (the bot's QQ account, the dashboard's adapter row);
  2. a private "ping" is answered; 3. a group @-mention is answered; 4. an inbound image is stored;
  5. a reminder (scheduled message) is delivered through the plugin and marked delivered from its result;
  6. NapCat restarts with three messages due meanwhile: each delivered once;
  7. NapCat refuses a send: the message is retried, then failed with NapCat's reason.

    .venv/bin/python bench/napcat_plugin.py /tmp/MaiBot-Napcat-Adapter [--plugin-id maibot-team.napcat-adapter]

The plugin's code is never copied into this repository: get it with `git archive` of the wanted commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port  # noqa: E402

BOT_QQ = 3_000_000_001
TOKEN = "napcat-bench-token"
BOT_CONFIG = '[bot]\nnickname = "小麦"\n[gateway]\nconfirm_seconds = 1.0\nmax_delivery_attempts = 2\n'


def operator_config(port: int) -> str:
    return (
        '[plugin]\nenabled = true\nconfig_version = "0.1.0"\n\n'
        f'[napcat_server]\nhost = "127.0.0.1"\nport = {port}\ntoken = "{TOKEN}"\n'
        "heartbeat_interval = 30\nreconnect_delay_sec = 1\naction_timeout_sec = 5\n\n"
        '[chat]\ngroup_list_type = "whitelist"\ngroup_list = ["555"]\n'
        'private_list_type = "whitelist"\nprivate_list = ["10001", "10003"]\n'
    )


def healthz(base: str) -> dict:
    """/healthz's JSON, whatever its status (503 while a check is down)."""
    try:
        with urllib.request.urlopen(f"{base}/healthz") as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


async def until(check, what: str, timeout: float = 30.0):
    """Poll `check` (sync ORM code runs in a thread) until it is truthy; SystemExit saying what is missing."""
    from asgiref.sync import sync_to_async

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check() if asyncio.iscoroutinefunction(check) else await sync_to_async(check)()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise SystemExit(f"FAILED: {what} (not within {timeout:g} s)")


def step(title: str, started: float, **facts) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {title}")
    for key, value in facts.items():
        print(f"           {key}: {value}")


async def scenario(base: str, napcat, fake, started: float) -> None:
    from asgiref.sync import sync_to_async
    from django.utils import timezone

    from chat.models import AdapterConnection, Message
    from chat.services import message_send, session_get_or_create
    from scheduling.services import SYSTEM, scheduled_message_create
    from tests.plugins.napcat_onebot import at, image, text

    def out(text_: str):
        return Message.objects.filter(direction="out", text=text_).first()

    conn = await until(
        lambda: AdapterConnection.objects.filter(platform="qq", disconnected_at__isnull=True).first(), "gateway ready"
    )
    health = await asyncio.to_thread(healthz, base)
    record = f"protocol {conn.protocol}, {conn.remote}"
    step("1. gateway ready", started, record=record, healthz=health["checks"]["adapters"])

    fake.script(fake.tool_call("reply", {"text": "pong"}))
    await napcat.private_message(10001, "ping", nickname="Alice")
    row = await until(lambda: (m := out("pong")) and m.delivery_status == "delivered" and m, "ping answered")
    sent = napcat.sent[-1]
    got = f"{sent.action} to {sent.target}: {sent.text()!r} id {sent.message_id}"
    step("2. private ping answered", started, napcat=got, row=f"{row.delivery_status}, id {row.platform_message_id}")

    napcat.members[("555", str(BOT_QQ))] = {"user_id": BOT_QQ, "nickname": "小麦", "card": "麦麦"}
    fake.script(fake.tool_call("reply", {"text": "在的"}))
    await napcat.group_message(555, 10002, [at(BOT_QQ), text(" 在吗")], nickname="Bob")
    row = await until(lambda: (m := out("在的")) and m.delivery_status == "delivered" and m, "group mention answered")
    inbound = await sync_to_async(lambda: Message.objects.filter(direction="in", session__group_id="555").first())()
    sent = napcat.sent[-1]
    step("3. group @-mention answered", started, inbound=repr(inbound.text), extra=inbound.extra.get("mentioned"),
         napcat=f"{sent.action} to {sent.target}: {sent.text()!r}", row=row.delivery_status)  # fmt: skip

    fake.script(fake.tool_call("no_reply", {}))
    url = f"http://127.0.0.1:{napcat.port}/img/cat.png"
    await napcat.private_message(10001, [text("看图"), image(url)], nickname="Alice")
    stored = await until(
        lambda: Message.objects.filter(direction="in", text__startswith="看图").first(), "image stored"
    )
    step("4. inbound image", started, segments=stored.segments)

    session = await sync_to_async(session_get_or_create)(platform="qq", chat_type="private", user_id="10003")
    task = (
        await sync_to_async(scheduled_message_create)(
            session=session, send_at=timezone.now() + timedelta(seconds=2), message_text="喝水提醒", acted_by=SYSTEM
        )
    ).task
    row = await until(lambda: (m := out("喝水提醒")) and m.delivery_status == "delivered" and m, "reminder delivered")
    late = f"{(row.delivered_at - task.send_at).total_seconds():.2f} s after send_at"
    state = f"{row.delivery_status}, platform id {row.platform_message_id}, source {row.source_kind}"
    step("5. reminder delivered", started, task=task.pk, delivered=late, row=state)

    before = len(napcat.sent)
    await napcat.stop()
    await until(lambda: not AdapterConnection.objects.filter(disconnected_at__isnull=True).exists(), "gateway down")
    rows = [
        await sync_to_async(message_send)(session=session, source_kind="proactive", text=f"重启 {i}") for i in range(3)
    ]
    await asyncio.sleep(1.0)  # NapCat stays away a while
    await napcat.start()
    ids = [r.pk for r in rows]
    await until(lambda: Message.objects.filter(pk__in=ids, delivery_status="delivered").count() == 3, "restart", 60)
    texts = [s.text() for s in napcat.sent[before:]]
    step("6. NapCat restart", started, napcat_got=texts, each_once=sorted(texts) == ["重启 0", "重启 1", "重启 2"])

    napcat.refuse["send_private_msg"] = "消息发送失败"
    row = await sync_to_async(message_send)(session=session, source_kind="proactive", text="会被拒绝")
    failed = await until(lambda: Message.objects.filter(pk=row.pk, delivery_status="failed").first(), "refusal", 30)
    asks = [a for a, p in napcat.actions if a == "send_private_msg" and "会被拒绝" in json.dumps(p, ensure_ascii=False)]
    step("7. NapCat refusal", started, attempts=failed.delivery_attempts, asked=len(asks), error=failed.delivery_error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the adapter plugin's folder (its _manifest.json and plugin.py)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir (logs included)")
    args = parser.parse_args()
    manifest = json.loads((args.folder / "_manifest.json").read_text(encoding="utf-8"))
    plugin_id = manifest["id"]
    data_dir, env = embedded_default(
        "maibot-napcat-plugin-", bot_config=BOT_CONFIG, MAIBOT_PLUGIN_HOST_NETWORK=plugin_id, PYTHONUNBUFFERED="1",
        MAIBOT_Q_NAME=f"bench-{os.getpid()}",
    )  # fmt: skip
    asyncio.run(run(args, data_dir, env, manifest))


async def run(args: argparse.Namespace, data_dir: Path, env: dict, manifest: dict) -> None:
    from core.config import BotConfig
    from maibot.management.commands.serve import daphne_argv
    from tests.fake_llm import FakeLLM
    from tests.plugins.napcat_onebot import NapCatOneBot

    napcat = await NapCatOneBot(self_id=BOT_QQ, token=TOKEN).start()
    folder = data_dir / "plugins" / args.folder.name
    shutil.copytree(args.folder, folder, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (folder / "config.toml").write_text(operator_config(napcat.port), encoding="utf-8")
    print(f"plugin {manifest['id']} {manifest['version']} ({manifest.get('plugin_type')}), host_application "
          f"{manifest['host_application']}, from {args.folder}")  # fmt: skip
    port = free_port()
    started = time.monotonic()
    with FakeLLM() as fake:
        fake.default = lambda body: fake.tool_call("no_reply", {})
        env = {**env, "OPENAI_BASE_URL": fake.base_url, "MAIBOT_LLM_MODEL": "fake-model", "LOG_LEVEL": "INFO"}
        logs = {"daphne": data_dir / "daphne.log", "qcluster": data_dir / "qcluster.log"}
        argv = {
            "daphne": daphne_argv("127.0.0.1", port, keepalive_seconds=BotConfig().gateway.keepalive_seconds),
            "qcluster": [sys.executable, "manage.py", "qcluster"],
        }
        procs = {}
        for name, command in argv.items():
            with open(logs[name], "wb") as out:
                procs[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            await scenario(f"http://127.0.0.1:{port}", napcat, fake, started)
            print(f"NapCat actions asked: {sorted({a for a, _ in napcat.actions})}")
            log = logs["daphne"].read_text(errors="replace")
            for line in log.splitlines():
                if f"plugin {manifest['id']}" in line and ("loaded" in line or "ready" in line):
                    print(f"log: {line.strip()[:300]}")
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(timeout=30)
            await napcat.stop()
            if args.keep:
                print(f"data dir kept: {data_dir}")
            else:
                shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
