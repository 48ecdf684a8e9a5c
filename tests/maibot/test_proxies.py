"""The one client-address rule (maibot.proxies), in-process: which X-Forwarded-For entry is believed, and
from whom. Through a real HAProxy and a real server: tests/maibot/test_behind_proxy.py."""

from __future__ import annotations

import asyncio

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from core.networks import parse_networks
from maibot.management.commands.serve import trusted_proxies_env
from maibot.proxies import ForwardedClientMiddleware, forwarded_client

PROXY = parse_networks("127.0.0.1, 10.0.0.0/8, fd00::/8", name="test")


def test_without_trusted_proxies_the_header_is_ignored():
    assert forwarded_client("127.0.0.1", ["203.0.113.5"], ()) == "127.0.0.1"


def test_a_peer_that_is_no_trusted_proxy_cannot_claim_another_address():
    assert forwarded_client("198.51.100.7", ["127.0.0.1"], PROXY) == "198.51.100.7"
    assert forwarded_client("198.51.100.7", ["10.1.1.1"], PROXY) == "198.51.100.7"


def test_the_right_most_entry_that_is_no_trusted_proxy_is_the_client():
    # nginx's $proxy_add_x_forwarded_for: whatever the client sent, then the address nginx saw.
    assert forwarded_client("127.0.0.1", ["127.0.0.1, 203.0.113.5"], PROXY) == "203.0.113.5"
    assert forwarded_client("127.0.0.1", ["10.0.0.9, 203.0.113.5"], PROXY) == "203.0.113.5"
    # Two proxies of ours (an edge at 10.2.3.4 in front of the local one); the client forged an entry.
    assert forwarded_client("127.0.0.1", ["192.0.2.1, 203.0.113.5, 10.2.3.4"], PROXY) == "203.0.113.5"
    # Several header lines are one list, in order.
    assert forwarded_client("127.0.0.1", ["192.0.2.1", "203.0.113.5"], PROXY) == "203.0.113.5"


def test_ports_brackets_and_mapped_addresses_are_read():
    assert forwarded_client("127.0.0.1", ["203.0.113.5:4711"], PROXY) == "203.0.113.5"
    assert forwarded_client("127.0.0.1", ["[2001:db8::1]:443"], PROXY) == "2001:db8::1"
    assert forwarded_client("127.0.0.1", ["2001:db8::1"], PROXY) == "2001:db8::1"
    assert forwarded_client("127.0.0.1", ["::ffff:203.0.113.5"], PROXY) == "203.0.113.5"
    assert forwarded_client("::ffff:127.0.0.1", ["203.0.113.5"], PROXY) == "203.0.113.5"


def test_a_deciding_entry_that_is_no_address_leaves_the_client_unknown_never_the_proxy():
    assert forwarded_client("127.0.0.1", ["203.0.113.5, unknown"], PROXY) is None
    assert forwarded_client("127.0.0.1", ["_hidden"], PROXY) is None
    # Left of the deciding entry, nothing is read.
    assert forwarded_client("127.0.0.1", ["garbage, 203.0.113.5"], PROXY) == "203.0.113.5"


def test_only_trusted_proxies_in_the_chain_means_the_left_most_and_no_header_the_peer():
    assert forwarded_client("127.0.0.1", ["10.0.0.3, 127.0.0.1"], PROXY) == "10.0.0.3"
    assert forwarded_client("127.0.0.1", [], PROXY) == "127.0.0.1"


def _through(scope: dict, trusted: str, settings) -> dict:
    settings.MAIBOT_TRUSTED_PROXIES = parse_networks(trusted, name="test")
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope)

    asyncio.run(ForwardedClientMiddleware(app)(scope, None, None))
    return seen


def _scope(kind: str, peer: str, *headers: tuple[bytes, bytes]) -> dict:
    scheme = "http" if kind == "http" else "ws"
    return {"type": kind, "client": [peer, 50000], "scheme": scheme, "headers": list(headers)}


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_the_middleware_rewrites_client_and_scheme_from_a_trusted_proxy_only(kind, settings):
    forwarded = ((b"x-forwarded-for", b"127.0.0.1, 203.0.113.5"), (b"x-forwarded-proto", b"https"))
    seen = _through(_scope(kind, "127.0.0.1", *forwarded), "127.0.0.1", settings)
    assert seen["client"] == ("203.0.113.5", 0)
    assert seen["scheme"] == ("https" if kind == "http" else "wss")
    # The same headers from a peer nobody vouches for change nothing.
    seen = _through(_scope(kind, "198.51.100.7", *forwarded), "127.0.0.1", settings)
    assert seen["client"] == ["198.51.100.7", 50000] and seen["scheme"] in ("http", "ws")
    # Nor without trusted proxies at all.
    seen = _through(_scope(kind, "127.0.0.1", *forwarded), "", settings)
    assert seen["client"] == ["127.0.0.1", 50000] and seen["scheme"] in ("http", "ws")


def test_the_middleware_keeps_the_peer_when_the_proxy_forwards_nothing_and_ignores_odd_schemes(settings):
    seen = _through(_scope("http", "127.0.0.1", (b"x-forwarded-proto", b"gopher")), "127.0.0.1", settings)
    assert seen["client"] == ["127.0.0.1", 50000] and seen["scheme"] == "http"
    lifespan = _through({"type": "lifespan"}, "127.0.0.1", settings)
    assert lifespan == {"type": "lifespan"}


def test_a_bad_trusted_proxy_entry_stops_start_up_naming_it():
    with pytest.raises(ImproperlyConfigured, match="MAIBOT_TRUSTED_PROXIES: 'localhost'"):
        parse_networks("127.0.0.1, localhost", name="MAIBOT_TRUSTED_PROXIES")
    with pytest.raises(CommandError, match=r"--trusted-proxies: '10\.0\.0\.1/8'"):
        trusted_proxies_env("10.0.0.1/8")
    assert trusted_proxies_env("10.0.0.0/8, ::1") == {"MAIBOT_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}
