"""What a request's headers say of its client and of the address it reached, believed only from a trusted proxy
(a load balancer, an ingress: Settings.trusted_proxies).

The client's address, for per-address limits while keys are off (Settings.address_*): the address the front
(HAProxy) saw the connection come from, which it sends as X-Beamserve-Peer over anything a client sent, or the
connection's own peer; where that is a trusted proxy, the last address of its X-Forwarded-For (which the front
sends on as X-Beamserve-Forwarded-For) that is not one.

The address the client reached, for the links the server answers where Settings.public_url is unset: the scheme,
host and path prefix a trusted proxy forwards (X-Forwarded-Proto, -Host, -Prefix, or RFC 7239's Forwarded), so a
link given behind TLS or under a prefix is the one the client can follow.

X-Beamserve-Peer is read only from a loopback peer or a trusted proxy, where the front runs: a client that
reaches a gateway replica some other way cannot name its own address.
"""

from __future__ import annotations

import ipaddress
import re
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


def _nearest(peer: str | None, headers: Mapping[str, str], trusted: tuple[Network, ...]) -> str:
    """The address the request came from to the front: the front's word for it where the front runs."""
    address = peer or "unknown"
    front = headers.get("x-beamserve-peer", "").strip()
    if front and (_loopback(address) or _within(address, trusted)):
        address = front
    return address


def client_address(peer: str | None, headers: Mapping[str, str], trusted: tuple[Network, ...]) -> str:
    """The address a request's limits count against (see the module's docstring)."""
    address = _nearest(peer, headers, trusted)
    front = headers.get("x-beamserve-peer", "").strip()
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


HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$")
PREFIX = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*/?$")


def reached_base(peer: str | None, headers: Mapping[str, str], trusted: tuple[Network, ...]) -> str | None:
    """The scheme, host and prefix the client reached (`https://translate.example.com/mt`), as the trusted proxy the
    request came from forwards them; None where it came from no trusted proxy or says no host, or says one that is
    not a host (nothing from a header reaches a link that a host, port and path would not hold)."""
    if not _within(_nearest(peer, headers, trusted), trusted):
        return None
    forwarded = _forwarded(headers.get("forwarded", ""))
    proto = (forwarded.get("proto") or _first(headers.get("x-forwarded-proto")) or "http").lower()
    host = forwarded.get("host") or _first(headers.get("x-forwarded-host"))
    prefix = _first(headers.get("x-forwarded-prefix")) or ""
    if proto not in ("http", "https") or not host or not HOST.match(host) or not PREFIX.match(prefix):
        return None
    return f"{proto}://{host}{prefix.rstrip('/')}"


def _first(value: str | None) -> str:
    """A forwarded header's first value (the client's side: each proxy on the way appends its own)."""
    return (value or "").split(",")[0].strip()


def _forwarded(value: str) -> dict[str, str]:
    """RFC 7239's Forwarded: the first element's parameters, quotes taken off."""
    element = value.split(",")[0]
    pairs = (part.split("=", 1) for part in element.split(";") if "=" in part)
    return {k.strip().lower(): v.strip().strip('"') for k, v in pairs}
