"""The console's secrets applied to a running server without a restart: against a live daphne whose
deployment.env holds qq's token and the model key, an operator rotates the token and sets a new key
through the console's endpoint; the real maim_message 0.7.5 client (API-Server mode) with the old token is
refused and one with the new token connects, and the planner's next call to the fake model server carries
the new key. No secret in the server's log."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request

import pytest
from django.contrib.auth.models import User
from django.test import Client

from core import deployment_env
from tests.chat.gateway_helpers import MM07_PYTHON, ApiClient, envelope
from tests.conftest import db, wait_for_async
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

OLD_TOKEN, OLD_KEY, NEW_KEY = "old-qq-token-live-123", "sk-old-live-key", "sk-new-live-key"


def operator_session() -> str:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return client.cookies["sessionid"].value


def console_secrets(base: str, session: str, *posts: dict[str, str]) -> tuple[str, list[dict]]:
    """The connect page's HTML, then the JSON answer of each POST to the secrets endpoint (as its script
    sends them: the CSRF cookie's token in X-CSRFToken)."""
    with urllib.request.urlopen(
        urllib.request.Request(f"{base}/admin/connect/", headers={"Cookie": f"sessionid={session}"}), timeout=30
    ) as resp:
        html = resp.read().decode()
        cookie = next(v for k, v in resp.headers.items() if k.lower() == "set-cookie" and v.startswith("csrftoken="))
    csrf = cookie.split(";")[0].split("=", 1)[1]
    answers = []
    for post in posts:
        request = urllib.request.Request(
            f"{base}/admin/connect/secret/",
            data=urllib.parse.urlencode(post).encode(),
            headers={"Cookie": f"sessionid={session}; csrftoken={csrf}", "X-CSRFToken": csrf,
                     "Referer": f"{base}/admin/connect/"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as resp:
            answers.append(json.loads(resp.read()))
    return html, answers


async def chat_once(base: str, token: str, fake: FakeLLM, text: str, message_id: int) -> None:
    """Connect with `token`, send one private message, wait for the planner's model call and take the
    bot's reply (else it would wait for the next connection, and reach it before its "connected")."""
    client = ApiClient(base, api_key=token)
    try:
        assert await client.start() == "connected"
        calls = len(fake.authorizations)
        await client.command({"cmd": "send", "frame": envelope(user_id=30003, text=text, message_id=message_id)})
        await wait_for_async(lambda: len(fake.authorizations) > calls, what="the planner's model call")
        assert "好的" in json.dumps(await client.next_message(timeout=30), ensure_ascii=False)
    finally:
        await client.stop()


async def test_a_rotated_token_and_a_new_key_apply_without_a_restart(start_server, tmp_path):
    if not MM07_PYTHON.exists():
        pytest.fail(f"{MM07_PYTHON} is missing: run `make venv-mm07`")
    data = tmp_path / "data-web"
    data.mkdir(mode=0o700)
    env_file = data / deployment_env.FILE_NAME
    deployment_env.update(env_file, {"MAIBOT_ADAPTER_TOKENS": f"qq:{OLD_TOKEN}", "OPENAI_API_KEY": OLD_KEY})
    session = await db(operator_session)
    with FakeLLM() as fake:
        fake.default = fake.tool_call("reply", {"text": "好的"})
        # OPENAI_API_KEY empty: not the environment's, so deployment.env's (and the console's) is used.
        log, base = start_server(OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", OPENAI_API_KEY="")
        await chat_once(base, OLD_TOKEN, fake, "first", 501)
        assert fake.authorizations[-1] == f"Bearer {OLD_KEY}"

        html, (rotated, changed) = await asyncio.to_thread(
            console_secrets,
            base,
            session,
            {"action": "rotate", "secret": "adapter:qq"},
            {"action": "set", "secret": "model:OPENAI_API_KEY", "value": NEW_KEY},
        )
        assert OLD_TOKEN not in html and OLD_KEY not in html
        new_token = rotated["value"]
        assert changed["ok"], changed

        old = ApiClient(base, api_key=OLD_TOKEN)
        try:
            assert await old.start() == "refused"
        finally:
            await old.stop()
        await chat_once(base, new_token, fake, "second", 502)
        assert fake.authorizations[-1] == f"Bearer {NEW_KEY}"
        assert log.popen.poll() is None  # the same server process throughout
    output = log.output()
    for secret in (OLD_TOKEN, OLD_KEY, NEW_KEY, new_token):
        assert secret not in output
