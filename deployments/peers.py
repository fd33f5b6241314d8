"""Who sent a request, as far as the ingress can tell: a client's share of grammar compiles is keyed by it,
and, unless the client names itself (`client_id`), its share of an engine's queue under the priority policy.

Behind ``make run``'s HAProxy every request comes from HAProxy, so the peer's address is the
same for every client. HAProxy there drops any ``X-Forwarded-For`` a client sent and adds its own
with the client's address (`deployments.haproxy_front`), and the ingress believes that header only
when HAProxy is the front (``RAY_SERVE_ENABLE_HA_PROXY=1``, which the launcher sets) and the peer is
a process of this machine (a loopback address or one of its own interfaces'): a client elsewhere
that sends the header itself, straight to a replica's port, is keyed by its own address. A local
process can still name any address; local users are trusted here as with the rest of the machine.
"""

from __future__ import annotations

import ipaddress
import os

import psutil
from starlette.requests import Request

FORWARDED_FOR = "x-forwarded-for"
CLIENT_ID_HEADER = "x-client-id"
"""A client's own name for its share of an engine's queue (clients behind one address or one API key)."""
MAX_CLIENT_ID_CHARS = 128
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"


def behind_haproxy(environ: dict[str, str] | None = None) -> bool:
    """Whether Serve's HAProxy fronts the replicas (a variable Ray's processes read; the launcher sets it)."""
    return (os.environ if environ is None else environ).get(HAPROXY_ENV) == "1"


def local_addresses() -> frozenset[str]:
    """This machine's own interface addresses (the peer a local HAProxy connects from)."""
    return frozenset(address.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for address in addresses)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def is_local(peer: str, local: frozenset[str]) -> bool:
    address = _address(peer)
    return address is not None and (address.is_loopback or str(address) in local or peer in local)


def forwarded_for(values: list[str]) -> str | None:
    """The address the last proxy added (the last entry of the last header), or None when it is not an address."""
    if not values:
        return None
    address = _address(values[-1].split(",")[-1])
    return None if address is None else str(address)


def client_address(request: Request, trust_local_proxy: bool, local: frozenset[str] = frozenset()) -> str:
    """The peer's address, or the client's address a local HAProxy forwarded when ``trust_local_proxy``."""
    peer = request.client.host if request.client is not None else ""
    if trust_local_proxy and is_local(peer, local):
        return forwarded_for(request.headers.getlist(FORWARDED_FOR)) or peer
    return peer


def client_id(request: Request) -> str | None:
    """The ``X-Client-Id`` header (its first `MAX_CLIENT_ID_CHARS` characters), or None. It names a
    share of the queue only: the grammar-compile cap stays keyed by the address, which a client cannot choose."""
    value = request.headers.get(CLIENT_ID_HEADER)
    return value[:MAX_CLIENT_ID_CHARS] if value else None
