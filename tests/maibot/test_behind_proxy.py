"""A real reverse proxy on the same host (HAProxy, configured as operators configure nginx or Caddy) in front
of a real server: attacks on the set-up page and on adapter admission from "outside", with and without the
proxy trusted (MAIBOT_TRUSTED_PROXIES), and forged X-Forwarded-For headers.

One machine has no outside: each of the proxy's front ends stands for clients at one address (HAProxy's
`tcp-request connection set-src`), so the proxy sees a client at, e.g., 203.0.113.5 and appends that to
X-Forwarded-For after whatever the client sent, as nginx's `$proxy_add_x_forwarded_for` does. The proxy
reaches the server from 127.0.0.2 (a loopback address, as any same-host proxy), and the tests themselves
connect from 127.0.0.1, which is therefore never a trusted proxy here.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from chat.models import Message
from core import setup
from tests.chat.gateway_helpers import Adapter06, Adapter07, RawSocket, envelope
from tests.cluster_support import listening, require
from tests.conftest import Proc, free_port, subprocess_env, wait_for, wait_for_async
from tests.core.test_setup_page import FORM
from tests.internal_service import SECRET, InternalService

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

PROXY_SOURCE = "127.0.0.2"
CODE = "the-printed-code"


class EdgeProxy:
    """HAProxy in front of one server: a front end per client address (None: the real peer, loopback).
    Each appends X-Forwarded-For; `https=True` front ends also say the client used TLS, as a
    TLS-terminating proxy does."""

    def __init__(self, root: Path, server: str, clients: dict[str, str | None], https: set[str] = frozenset()) -> None:
        self.ports = {name: free_port() for name in clients}
        lines = [
            "defaults",
            "    mode http",
            "    timeout connect 3s",
            "    timeout client 60s",
            "    timeout server 60s",
            "    timeout tunnel 1h",
        ]
        for name, address in clients.items():
            lines += [f"frontend {name}", f"    bind 127.0.0.1:{self.ports[name]}"]
            if address:
                lines.append(f"    tcp-request connection set-src ipv4({address})")
            lines.append("    option forwardfor")
            proto = "https" if name in https else "http"
            lines += [f"    http-request set-header X-Forwarded-Proto {proto}", "    default_backend app"]
        lines += ["backend app", f"    server app {server} source {PROXY_SOURCE}"]
        config = root / "edge.cfg"
        config.write_text("\n".join(lines) + "\n")
        self.proc = Proc([require("haproxy", "haproxy"), "-db", "-f", str(config)], {}, root / "edge.log")
        if not wait_for(lambda: all(listening(p) for p in self.ports.values()), timeout=20):
            raise TimeoutError(f"haproxy did not listen:\n{self.proc.output()}")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def edge(tmp_path):
    proxies: list[EdgeProxy] = []

    def start(base: str, clients: dict[str, str | None], https: set[str] = frozenset()) -> EdgeProxy:
        proxy = EdgeProxy(tmp_path, base.removeprefix("http://"), clients, https)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


def _pending_set_up(tmp_path: Path, name: str) -> Path:
    data = tmp_path / f"data-{name}"
    data.mkdir(parents=True, exist_ok=True)
    (data / setup.CODE_FILE).write_text(CODE + "\n")
    return data


class Browser:
    """A client of the set-up page (requests, with Django's CSRF cookie), sending `headers` always."""

    def __init__(self, base: str, **headers: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers.update(headers)

    def get(self, path: str) -> requests.Response:
        return self.session.get(self.base + path, allow_redirects=False, timeout=30)

    def post(self, path: str, data: dict, **headers: str) -> requests.Response:
        if "csrftoken" not in self.session.cookies:
            self.get("/setup/")
        data = {**data, "csrfmiddlewaretoken": self.session.cookies["csrftoken"]}
        return self.session.post(self.base + path, data=data, headers=headers, allow_redirects=False, timeout=60)


def _operators() -> list[str]:
    return list(get_user_model().objects.filter(is_superuser=True).values_list("username", flat=True))


def test_through_an_unconfigured_same_host_proxy_set_up_still_needs_the_code(start_server, edge, tmp_path):
    """The issue's attack: the proxy is not declared, so every client looks like loopback (the proxy)."""
    data = _pending_set_up(tmp_path, "open")
    _, base = start_server("open")
    config_before = (data / "bot_config.toml").read_text() if (data / "bot_config.toml").exists() else None
    proxy = edge(base, {"outside": "203.0.113.5"})
    attacker = Browser(proxy.url("outside"), **{"X-Forwarded-For": "203.0.113.5"})
    service = InternalService(200, "text/plain", SECRET)
    try:
        assert attacker.get("/admin/").headers["Location"] == "/setup/"
        assert 'name="code"' in attacker.get("/setup/").text
        takeover = {**FORM, "username": "attacker", "nickname": "Pwned", "llm_api_key": "sk-attacker"}
        assert attacker.post("/setup/", takeover).status_code == 403  # no code
        assert _operators() == []
        test = attacker.post("/setup/test-model/", {"llm_base_url": service.url, "llm_model": "m"})
        assert test.status_code == 403 and SECRET not in test.text
        statuses = [attacker.post("/setup/", {**takeover, "code": f"guess{i}"}).status_code for i in range(5)]
        assert statuses == [403] * 5
        # Locked out now, even with the right code (here every client shares the proxy's address).
        locked = attacker.post("/setup/", {**takeover, "code": CODE})
        assert locked.status_code == 429 and "Too many wrong codes" in locked.text
    finally:
        service.close()
    assert service.hits == 0
    assert _operators() == []
    assert not (data / "deployment.env").exists()
    after = (data / "bot_config.toml").read_text() if (data / "bot_config.toml").exists() else None
    assert after == config_before


def test_with_the_proxy_trusted_the_real_client_is_counted_and_a_forged_header_is_not(start_server, edge, tmp_path):
    _pending_set_up(tmp_path, "trusted")
    _, base = start_server("trusted", MAIBOT_TRUSTED_PROXIES=PROXY_SOURCE)
    proxy = edge(base, {"attacker": "203.0.113.5", "operator": "203.0.113.6", "tls": "203.0.113.7"}, https={"tls"})
    attacker = Browser(proxy.url("attacker"))
    for i in range(5):
        # Claiming to be someone else each time changes nothing: the proxy's own entry is the last one.
        forged = {"X-Forwarded-For": f"203.0.113.6, 10.0.0.{i}"}
        assert attacker.post("/setup/", {**FORM, "code": f"guess{i}"}, **forged).status_code == 403
    assert attacker.post("/setup/", {**FORM, "code": CODE}).status_code == 429
    # Straight to the server, the header is the client's own: ignored (this is 127.0.0.1, not locked out).
    direct = Browser(base, **{"X-Forwarded-For": "203.0.113.5"})
    assert direct.post("/setup/", {**FORM, "code": "guess"}).status_code == 403
    # The operator, elsewhere, is not locked out by the attacker.
    operator = Browser(proxy.url("operator"))
    done = operator.post("/setup/", {**FORM, "code": CODE})
    assert done.status_code == 302 and done.headers["Location"] == "/", done.text
    assert _operators() == ["op"]

    # X-Forwarded-Proto from the trusted proxy: a browser's https Origin passes Django's CSRF check
    # without CSRF_TRUSTED_ORIGINS; the same Origin through a plain-http front end, or sent by a client
    # straight to the server with its own X-Forwarded-Proto, does not.
    login = {"username": "op", "password": FORM["password"], "next": "/admin/"}
    for name, expected in (("tls", 302), ("attacker", 403)):
        browser = Browser(proxy.url(name))
        browser.get("/admin/login/")
        origin = f"https://127.0.0.1:{proxy.ports[name]}"
        assert browser.post("/admin/login/", login, Origin=origin).status_code == expected, name
    forger = Browser(base, **{"X-Forwarded-Proto": "https"})
    forger.get("/admin/login/")
    assert forger.post("/admin/login/", login, Origin=base.replace("http:", "https:")).status_code == 403


async def test_an_adapter_through_a_trusted_proxy_is_judged_by_its_real_address(edge, tmp_path):
    """`manage.py serve --trusted-proxies`, no adapter tokens: only loopback adapters may connect. An
    adapter at 203.0.113.5 behind the same-host proxy is refused on both wire versions; one at loopback
    behind the same proxy is admitted."""
    port = free_port()
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data-serve"), MAIBOT_CONSOLE_SERVICES="0")
    env.pop("MAIBOT_ADAPTER_TOKENS", None)
    serve = Proc(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--trusted-proxies", PROXY_SOURCE],
        env,
        tmp_path / "serve.log",
    )
    try:
        serve.wait_for_output(f"trusted proxies:  {PROXY_SOURCE}", timeout=60)
        assert wait_for(lambda: listening(port), timeout=60), serve.output()
        proxy = edge(f"http://127.0.0.1:{port}", {"outside": "203.0.113.5", "local": None})
        far = Adapter07(proxy.url("outside"), token=None)
        try:
            assert await far.start() == "refused"
        finally:
            await far.stop()
        async with RawSocket(proxy.url("outside"), token=None) as ws:
            assert await ws.closed_with() == 1008
        serve.wait_for_output("connection from 203.0.113.5 (platform 'qq') refused")
        near = await Adapter06(proxy.url("local"), token=None).start()
        try:
            await near.send(envelope(text="through the proxy from loopback"))
            await wait_for_async(lambda: Message.objects.filter(text="through the proxy from loopback").exists())
        finally:
            await near.stop()
    finally:
        serve.stop()


async def test_allow_from_matches_the_forwarded_address_and_never_a_forged_one(start_server, edge, tmp_path):
    _, base = start_server(
        "allow",
        MAIBOT_TRUSTED_PROXIES=PROXY_SOURCE,
        MAIBOT_ADAPTER_TOKENS="discord:the-token",  # qq and wechat have no token: ALLOW_FROM admits them
        MAIBOT_ADAPTER_ALLOW_FROM="203.0.113.0/24",
    )
    proxy = edge(base, {"listed": "203.0.113.5", "unlisted": "198.51.100.5"})
    async with RawSocket(proxy.url("listed"), token=None) as ws:
        await ws.send_json(envelope(text="from the listed network"))
        await wait_for_async(lambda: Message.objects.filter(text="from the listed network").exists())
    listed = Adapter07(proxy.url("listed"), platform="wechat", token=None)
    try:
        assert await listed.start() == "connected"
    finally:
        await listed.stop()
    # Outside the network: a token is needed; claiming the network in a header, here or straight to the
    # server, does not help.
    async with RawSocket(proxy.url("unlisted"), token=None) as ws:
        assert await ws.closed_with() == 1008
    forged = RawSocket(proxy.url("unlisted"), token=None)
    forged.headers["X-Forwarded-For"] = "203.0.113.5"
    async with forged as ws:
        assert await ws.closed_with() == 1008
    direct = RawSocket(base, token=None)
    direct.headers["X-Forwarded-For"] = "203.0.113.5"
    async with direct as ws:
        assert await ws.closed_with() == 1008


def test_two_set_ups_at_once_make_one_operator(start_server, tmp_path):
    _pending_set_up(tmp_path, "race")
    _, base = start_server("race")
    browsers = [Browser(base) for _ in range(4)]
    for browser in browsers:
        browser.get("/setup/")
    barrier = threading.Barrier(len(browsers))
    answers: list[requests.Response] = []

    def finish(i: int) -> None:
        barrier.wait()
        answers.append(browsers[i].post("/setup/", {**FORM, "username": f"op{i}", "code": CODE}))

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(len(browsers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(_operators()) == 1, _operators()
    # The others are sent away (302), or find the code gone meanwhile (403).
    assert len(answers) == len(browsers) and {a.status_code for a in answers} <= {302, 403}
    # Only the one that made the operator is logged in.
    logged_in = [b for b in browsers if b.get("/admin/").status_code == 200]
    assert len(logged_in) == 1
    assert re.search(r"op\d", logged_in[0].get("/admin/").text)
