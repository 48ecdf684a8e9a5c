"""Installing a plugin through a live server: an operator uploads the weather plugin's zip to a running
daphne whose plugins folder is empty; the folder watcher loads it, the Plugins page shows it loaded and
the install recorded, and its command answers a QQ user through the real maim_message client. A
request declaring a body over the upload limit is answered 413 before the server reads it."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from plugins.models import PluginInstall
from tests.chat.gateway_helpers import Adapter06, envelope
from tests.conftest import db
from tests.fake_llm import FakeLLM
from tests.plugins.install_helpers import WEATHER_FOLDER, WEATHER_ID, make_zip, plugin_files

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.backend_independent]

TOKEN = "install-live-token"


def operator_session() -> str:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return client.cookies["sessionid"].value


def get_page(base: str, session: str) -> tuple[str, str]:
    """The Plugins page's HTML and the CSRF cookie's token."""
    request = urllib.request.Request(f"{base}/admin/plugins/", headers={"Cookie": f"sessionid={session}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        html = resp.read().decode()
        cookie = next((v for k, v in resp.headers.items() if k.lower() == "set-cookie" and "csrftoken=" in v), "")
    return html, cookie.split(";")[0].split("=", 1)[1] if cookie else ""


def upload_zip(base: str, session: str, csrf: str, data: bytes) -> str:
    """POST the Install form as the browser does (multipart/form-data); the page it redirects to."""
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="csrfmiddlewaretoken"\r\n\r\n{csrf}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="archive"; filename="weather.zip"\r\n'
            "Content-Type: application/zip\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        f"{base}/admin/plugins/install/",
        data=body,
        headers={
            "Cookie": f"sessionid={session}; csrftoken={csrf}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Referer": f"{base}/admin/plugins/",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.read().decode()


def declare_huge_upload(base: str) -> bytes:
    """Headers declaring a 1 GiB body, and no body: the answer (the server must not wait for the body)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /admin/plugins/install/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 1073741824\r\n\r\n"
        )
        return sock.recv(4096)


async def test_an_uploaded_plugin_loads_and_its_command_answers(start_server, tmp_path):
    session = await db(operator_session)
    with FakeLLM() as fake:
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=f"qq:{TOKEN}"
        )
        await asyncio.to_thread(proc.wait_for_output, "plugins loaded: 0 of 0", 60)
        assert (tmp_path / "data-web" / "plugins").is_dir()
        assert (await asyncio.to_thread(declare_huge_upload, base)).startswith(b"HTTP/1.1 413")

        html, csrf = await asyncio.to_thread(get_page, base, session)
        assert 'id="plugin-install-form"' in html and csrf
        page = await asyncio.to_thread(upload_zip, base, session, csrf, make_zip(plugin_files(), "weather-main/"))
        assert 'id="plugin-installs"' in page  # back on the Plugins page (its message is in a cookie)
        await asyncio.to_thread(proc.wait_for_output, f"plugin {WEATHER_ID}: new plugin → loaded", 60)
        row = await db(lambda: PluginInstall.objects.select_related("user").get())
        assert row.ok and row.user.username == "op" and row.plugin_id == WEATHER_ID
        html, _ = await asyncio.to_thread(get_page, base, session)
        listed = html.split(f'data-plugin="{WEATHER_ID}"')[1].split("</tr>")[0]
        assert 'class="state console-ok">loaded<' in listed
        installs = html.split('id="plugin-installs"')[1]
        assert WEATHER_ID in installs and f"{WEATHER_FOLDER}/" in installs and "weather.zip" in installs

        adapter = await Adapter06(base, token=TOKEN).start()
        try:
            await adapter.send(envelope(user_id=10001, nickname="Alice", text="/hello Bob"))
            frame = await adapter.next_message(timeout=30)
            assert [s["data"] for s in frame["message_segment"]["data"] if s["type"] == "text"] == ["Hi, Bob!"]
            assert fake.requests == []  # the plugin's command answered, not the model
        finally:
            await adapter.stop()
