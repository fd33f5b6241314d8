"""The client a request is keyed by (its share of grammar compiles): the peer, or behind `make run`'s
HAProxy the address HAProxy forwarded, believed from a local peer alone."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from deployments.peers import MAX_CLIENT_ID_CHARS, behind_haproxy, client_address, client_id, forwarded_for, local_addresses
from tests.deployments.in_process import WAIT_S, FakeEngineClient, ingress, post

LOCAL = frozenset({"127.0.0.1", "192.0.2.2"})


def request(peer: str, *forwarded: str) -> Request:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "client": (peer, 5000), "query_string": b""})


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("127.0.0.1", ["203.0.113.9"], "203.0.113.9"),  # HAProxy on loopback
        ("192.0.2.2", ["203.0.113.9"], "203.0.113.9"),  # HAProxy on one of this machine's interfaces (--host 0.0.0.0)
        ("::ffff:127.0.0.1", ["2001:db8::5"], "2001:db8::5"),
        ("127.0.0.1", ["198.51.100.1, 10.0.0.1", "203.0.113.9"], "203.0.113.9"),  # the last header is HAProxy's
        ("127.0.0.1", ["not an address"], "127.0.0.1"),
        ("127.0.0.1", [], "127.0.0.1"),
        ("198.51.100.7", ["203.0.113.9"], "198.51.100.7"),  # a client elsewhere, straight to a replica's port
    ],
)
def test_the_forwarded_address_is_believed_from_a_local_peer_alone(peer, forwarded, expected):
    assert client_address(request(peer, *forwarded), True, LOCAL) == expected


def test_without_haproxy_in_front_the_header_is_the_clients_own():
    assert client_address(request("127.0.0.1", "203.0.113.9"), False, LOCAL) == "127.0.0.1"
    assert behind_haproxy({"RAY_SERVE_ENABLE_HA_PROXY": "1"}) and not behind_haproxy({})


def test_this_machines_addresses_include_loopback():
    assert "127.0.0.1" in local_addresses()
    assert forwarded_for([]) is None and forwarded_for([" 203.0.113.9 "]) == "203.0.113.9"


@pytest.mark.timeout(2 * WAIT_S)
def test_the_ingress_keys_each_forwarded_client_apart():
    async def run() -> list[str]:
        client = FakeEngineClient()
        client.finish.set()
        replica = ingress(client)
        replica.trust_local_proxy, replica.local_addresses = True, LOCAL
        body = {"model": "tiny-random", "prompt": "hi", "max_tokens": 2}
        for address in ("203.0.113.9", "198.51.100.1"):
            response = await asyncio.wait_for(replica(post("/v1/completions", body, headers=[(b"x-forwarded-for", address.encode())])), WAIT_S)
            assert response.status_code == 200
        far = await asyncio.wait_for(replica(post("/v1/completions", body, peer="198.51.100.7", headers=[(b"x-forwarded-for", b"10.9.9.9")])), WAIT_S)
        assert far.status_code == 200
        return client.clients

    assert asyncio.run(run()) == ["203.0.113.9", "198.51.100.1", "198.51.100.7"]


def test_a_client_names_its_share_of_the_queue_with_a_bounded_header():
    def with_id(value: bytes) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/", "headers": [(b"x-client-id", value)], "client": ("127.0.0.1", 5000), "query_string": b""})

    assert client_id(request("127.0.0.1")) is None
    assert client_id(with_id(b"team-a")) == "team-a"
    assert client_id(with_id(b"x" * 1000)) == "x" * MAX_CLIENT_ID_CHARS


@pytest.mark.timeout(2 * WAIT_S)
def test_the_ingress_passes_the_client_id_beside_the_address():
    async def run() -> tuple[list[str], list[str | None]]:
        client = FakeEngineClient()
        client.finish.set()
        replica = ingress(client)
        body = {"model": "tiny-random", "prompt": "hi", "max_tokens": 2, "priority": 3}
        for headers in ([(b"x-client-id", b"team-a")], []):
            response = await asyncio.wait_for(replica(post("/v1/completions", body, headers=headers)), WAIT_S)
            assert response.status_code == 200
        assert [params.priority for params in client.submitted] == [3, 3]  # vLLM's field reaches the engine's parameters
        return client.clients, client.client_ids

    clients, client_ids = asyncio.run(run())
    assert client_ids == ["team-a", None] and clients[0] == clients[1]  # the compile cap stays keyed by the address
