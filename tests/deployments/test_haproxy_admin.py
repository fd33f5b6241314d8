"""The launcher's drain against a stand-in for HAProxy's admin socket (no Ray, no HAProxy): the
serving frontend is disabled first, the wait ends when no request is in flight, at the timeout, or
at a second signal; and ``show stat``'s CSV is read as HAProxy writes it. A real HAProxy drains in
`test_launched_front.py`."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from deployments import launch
from deployments.haproxy_admin import requests_in_flight
from deployments.launch import DRAIN_TIMEOUT_S, drain, haproxy_sockets, parse_args

HEADER = "# pxname,svname,qcur,qmax,scur,smax,slim,stot\n"


def stat_csv(app_sessions: int, frontend_sessions: int = 7) -> str:
    """``show stat`` as HAProxy answers it: frontends, an app backend with one server, the stats proxy."""
    return HEADER + (
        f"http_frontend,FRONTEND,,,{frontend_sessions},9,,100\n"
        f"spout,replica-1,0,0,{app_sessions},4,,50\n"
        f"spout,BACKEND,0,0,{app_sessions},4,,50\n"
        "stats,BACKEND,0,0,1,1,,3\n"
    )


def test_only_the_app_backends_sessions_count():
    assert requests_in_flight(stat_csv(3)) == 3  # not the frontend's idle keep-alive connections, nor the stats page
    assert requests_in_flight(stat_csv(0)) == 0


@dataclass
class FakeHAProxy:
    """Answers each connection's command; ``show stat`` gives the next of ``in_flight``'s counts (the last one repeats)."""

    path: str
    in_flight: list[int]
    commands: list[str] = field(default_factory=list)

    def serve(self, server: socket.socket) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                line = connection.recv(1024).decode().strip()
                self.commands.append(line)
                if line == "show stat":
                    count = self.in_flight.pop(0) if len(self.in_flight) > 1 else self.in_flight[0]
                    connection.sendall(stat_csv(count).encode())


@pytest.fixture
def haproxy() -> Iterator[FakeHAProxy]:
    folder = tempfile.mkdtemp(prefix="spout-admin-", dir="/tmp")
    fake = FakeHAProxy(os.path.join(folder, "admin.sock"), [3, 2, 0])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(fake.path)
    server.listen()
    thread = threading.Thread(target=fake.serve, args=(server,), daemon=True)
    thread.start()
    yield fake
    server.close()
    os.unlink(fake.path)
    os.rmdir(folder)


class Signals:
    """`launch.StopSignals` as the drain reads it: a count of signals received."""

    def __init__(self, count: int = 1) -> None:
        self.count = count


def test_the_drain_stops_new_connections_then_waits_until_nothing_is_in_flight(haproxy, capsys):
    drain([haproxy.path], Signals(), timeout_s=30)
    assert haproxy.commands[0] == "disable frontend http_frontend"
    assert haproxy.commands[1:] == ["show stat"] * 3
    assert "Draining: 3 requests in flight" in capsys.readouterr().out


def test_the_drain_ends_at_its_timeout(haproxy, capsys, monkeypatch):
    haproxy.in_flight = [5]
    monkeypatch.setattr(launch, "DRAIN_POLL_S", 0.01)
    drain([haproxy.path], Signals(), timeout_s=0.1)
    assert "Drain ended with 5 requests in flight" in capsys.readouterr().out


def test_a_second_signal_ends_the_drain(haproxy, capsys, monkeypatch):
    haproxy.in_flight = [5]
    signals = Signals()
    monkeypatch.setattr(launch.time, "sleep", lambda seconds: setattr(signals, "count", 2))
    drain([haproxy.path], signals, timeout_s=30)
    assert len(haproxy.commands) == 3  # disable, the first count, one more after the sleep the signal ended
    assert "Drain ended with 5" in capsys.readouterr().out


def test_no_haproxy_is_no_drain(tmp_path, capsys):
    drain([str(tmp_path / "none.sock")], Signals(), timeout_s=30)
    drain(haproxy_sockets(str(tmp_path)), Signals(), timeout_s=30)
    assert capsys.readouterr().out.count("Not drained") == 2


def test_the_sockets_are_found_in_each_nodes_folder(tmp_path):
    for node in ("node-a", "node-b"):
        (tmp_path / node).mkdir()
        (tmp_path / node / "admin.sock").touch()
    assert haproxy_sockets(str(tmp_path)) == [str(tmp_path / "node-a" / "admin.sock"), str(tmp_path / "node-b" / "admin.sock")]


def test_the_drain_timeout_is_an_option_with_a_default():
    assert parse_args([]).drain_timeout_s == DRAIN_TIMEOUT_S == 30.0
    assert parse_args(["--drain-timeout-s", "0", "model=tiny-random"]).drain_timeout_s == 0
    with pytest.raises(SystemExit):
        parse_args(["--drain-timeout-s", "-1"])
