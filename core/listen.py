"""The URLs a server bound to HOST:PORT can be opened at, for the lines it prints: a wildcard bind (0.0.0.0,
::) becomes 127.0.0.1 and this machine's own addresses (never "0.0.0.0", which no browser can open)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_IF_INET6 = Path("/proc/net/if_inet6")


def _ipv4_addresses() -> list[str]:
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append(socket.inet_ntoa(answer[20:24]))
    return found


def _ipv6_addresses() -> list[str]:
    try:
        lines = _IF_INET6.read_text().splitlines()
    except OSError:
        return []
    return [str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))) for line in lines if line.split()]


def machine_addresses(*, ipv6: bool) -> list[str]:
    """This machine's addresses another machine may reach it at: loopback and link-local left out (a
    link-local address needs a zone id no URL carries). IPv4 first, in interface order."""
    candidates = _ipv4_addresses() + (_ipv6_addresses() if ipv6 else [])
    if not candidates:  # not Linux: what the host name resolves to
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_UNSPEC if ipv6 else socket.AF_INET)
        candidates = [info[4][0] for info in infos]
    seen: list[str] = []
    for text in candidates:
        address = ipaddress.ip_address(text)
        if not (address.is_loopback or address.is_link_local or address.is_unspecified) and text not in seen:
            seen.append(text)
    return seen


def open_urls(host: str, port: int | str, path: str = "/") -> list[str]:
    """Where a browser can open `path` of a server bound to host:port: the host itself, or for a wildcard
    bind 127.0.0.1 (on this machine) and then each of the machine's own addresses (from elsewhere)."""
    if host not in WILDCARDS:
        hosts = [host]
    else:
        hosts = ["127.0.0.1", *machine_addresses(ipv6=host not in {"0.0.0.0"})]
    return [f"http://{_bracketed(h)}:{port}{path}" for h in hosts]


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
