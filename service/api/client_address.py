"""A request's client address, for per-address limits while keys are off (Settings.address_*): the address the
front (HAProxy) saw the connection come from, which it sends as X-Beamserve-Peer over anything a client sent, or
the connection's own peer; where that is a trusted proxy (a load balancer, an ingress: Settings.trusted_proxies),
the last address of its X-Forwarded-For (which the front sends on as X-Beamserve-Forwarded-For) that is not one.

X-Beamserve-Peer is read only from a loopback peer or a trusted proxy, where the front runs: a client that
reaches a gateway replica some other way cannot name its own address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(setting: str) -> tuple[Network, ...]:
    """The networks of Settings.trusted_proxies ("10.0.0.0/8, 192.0.2.7"); ValueError naming a bad entry."""
    out = []
    for part in setting.split(","):
        if part.strip():
            try:
                out.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise ValueError(f"trusted_proxies: {part.strip()!r} is not an address or network") from None
    return tuple(out)


def _within(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(peer: str | None, headers: Mapping[str, str], trusted: tuple[Network, ...]) -> str:
    """The address a request's limits count against (see the module's docstring)."""
    address = peer or "unknown"
    front = headers.get("x-beamserve-peer", "").strip()
    if front and (_loopback(address) or _within(address, trusted)):
        address = front
    if _within(address, trusted):
        forwarded = headers.get("x-beamserve-forwarded-for") if front else headers.get("x-forwarded-for")
        hops = [h.strip() for h in (forwarded or "").split(",") if h.strip()]
        for hop in reversed(hops):  # the nearest first: each trusted proxy appended the address it saw
            if not _within(hop, trusted):
                return hop
    return address


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
