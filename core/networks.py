"""Network lists from the environment (MAIBOT_ADAPTER_ALLOW_FROM): parsing CIDRs with a clear error, and
matching a client's address against them; the address a per-client limit counts a client by."""

from __future__ import annotations

import ipaddress

from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# A deployment lists a few networks; a longer list is a mistake (or a file pasted into a variable).
MAX_NETWORKS = 256


def parse_networks(value: str, *, name: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs (`10.0.0.0/8, 192.168.1.7, fd00::/8`); a bare address is a /32 (/128).

    Raises ImproperlyConfigured naming the variable and the bad entry. Host bits set
    (`192.168.1.7/24`) are refused rather than guessed at: the operator meant either the address or
    the network, and this list admits clients without a token.
    """
    entries = [part.strip() for part in value.split(",") if part.strip()]
    if len(entries) > MAX_NETWORKS:
        raise ImproperlyConfigured(f"{name}: at most {MAX_NETWORKS} networks, got {len(entries)}")
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=True))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {entry!r} is not a network in CIDR notation ({exc})") from None
    return tuple(networks)


def address_in(host: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether a client address (as the ASGI scope gives it; an IPv4-mapped IPv6 address counts as its
    IPv4 address) lies in one of the networks. Anything that is not an address is in none."""
    if not networks or not host:
        return False
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def client_block(host: str | None) -> str | None:
    """The address a per-client limit counts a client by (the set-up code's and the login's failures):
    an IPv4 address as it is (an IPv4-mapped IPv6 address as its IPv4 address), an IPv6 address as the
    first address of its /64, which one host usually has whole (so it cannot step out of its count by
    changing address). None when `host` is not an address."""
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return str(address)
