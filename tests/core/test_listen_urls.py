"""The address a first run prints is one a browser can open: bound to 0.0.0.0 or ::, the set-up page is
printed at 127.0.0.1 and at each of this machine's own addresses, never at http://0.0.0.0:…/setup/."""

from __future__ import annotations

import io
import ipaddress
import re
import socket

import pytest
from django.core.management import call_command

from core import setup
from core.listen import machine_addresses, open_urls

pytestmark = pytest.mark.django_db


def bindable(address: str) -> bool:
    """True when `address` is this machine's own: the kernel lets a socket bind to it."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def printed_setup_urls(settings, tmp_path, host: str) -> list[str]:
    settings.DATA_DIR, settings.HOST, settings.PORT = tmp_path, host, 8733
    out = io.StringIO()
    call_command("bootstrap", setup_page=True, stdout=out)
    assert setup.code_path().exists()  # the code the page asks for was issued
    return re.findall(r"set-up page:\s+(\S+)", out.getvalue())


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_bind_prints_loopback_and_the_machines_own_addresses(settings, tmp_path, host):
    urls = printed_setup_urls(settings, tmp_path, host)
    assert urls[0] == "http://127.0.0.1:8733/setup/"
    hosts = [re.match(r"http://\[?([^\]/]+?)\]?:8733/setup/$", url).group(1) for url in urls]
    others = hosts[1:]
    assert others, f"no address of this machine printed: {urls}"
    for address in others:
        ip = ipaddress.ip_address(address)
        assert not (ip.is_unspecified or ip.is_loopback or ip.is_link_local)
        assert bindable(address), f"{address} is not this machine's"
    if host == "0.0.0.0":  # an IPv4 bind is not reached at an IPv6 address
        assert not any(":" in a for a in others)
    else:
        assert {a for a in machine_addresses(ipv6=True) if ":" in a} <= set(others)
    assert all(url.startswith("http://[") for url in urls if url.count(":") > 2)  # IPv6 in brackets


def test_a_named_bind_prints_that_name_only(settings, tmp_path):
    assert printed_setup_urls(settings, tmp_path, "127.0.0.1") == ["http://127.0.0.1:8733/setup/"]
    assert open_urls("bot.example.com", 80, "/setup/") == ["http://bot.example.com:80/setup/"]


def test_run_clusters_start_up_lines_name_addresses_a_browser_can_open():
    from maibot.management.commands.run_cluster import cluster_banner

    lines = cluster_banner("0.0.0.0", 8733, ["127.0.0.1:8734", "127.0.0.1:8735"])
    assert "0.0.0.0" not in lines
    assert "operator console: http://127.0.0.1:8733/admin/" in lines
    assert "adapters connect: ws://127.0.0.1:8733/ws" in lines
    for address in machine_addresses(ipv6=False):
        assert f"http://{address}:8733/admin/" in lines
    assert cluster_banner("bot.example.com", 80, []).count("/admin/") == 1
