"""One real Ray Serve app for the whole test session, on loopback, default model on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from bench.lib.serve_cluster import DEFAULT_PROXY, ServeCluster
from deployments import build_app
from deployments.driver import wait_until_healthy
from deployments.engine_placement import app_engine

MODEL = "smollm2-135m-instruct"
API_KEY = "test-key"
STARTUP_TIMEOUT_S = 300


@dataclass
class Server:
    base_url: str
    """Serve's port, where ``serve run`` serves: HAProxy in front of the ingress replica."""
    direct_url: str
    """The ingress replica's own port (direct ingress)."""
    model: str
    api_key: str
    app: str = "spout"
    """The Serve application's name."""

    def engine(self, index: int = 0):
        return app_engine(self.app, index)

    def http(self, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120, **kwargs)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key, timeout=120, max_retries=0)

    def async_openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key, timeout=300, max_retries=0)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ServeCluster]:
    """Ray and Serve on loopback, set up as ``make run ARGS="http_front=serve"`` sets them up (`deployments.launch`): HAProxy on
    Serve's port in front of throughput-optimized ingress replicas, which serve HTTP themselves
    (direct ingress). Shut down at the session's end."""
    with ServeCluster(DEFAULT_PROXY) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def server(cluster: ServeCluster) -> Iterator[Server]:
    """The default model's app at route ``/``; the tests talk to Serve's port, on loopback."""
    app = build_app(
        {
            "model": MODEL,
            "max_num_seqs": 32,
            "max_model_len": 1024,
            "api_key": API_KEY,
            "inline_detok_threshold": 8,
            "detok_min_replicas": 1,
            "max_client_speculative_tokens": 16,
            "max_allowed_token_ids": 4096,  # under the body limit, so the hostile suite can go over it
            "max_constrained_rows": 16,  # half the rows: constrained floods leave room for the others
        }
    )
    port = cluster.deploy(app, "spout", timeout_s=STARTUP_TIMEOUT_S)
    base_url = f"http://127.0.0.1:{port}"
    direct_url = f"http://127.0.0.1:{cluster.direct_port('spout')}"
    wait_until_healthy(base_url, STARTUP_TIMEOUT_S)
    yield Server(base_url=base_url, direct_url=direct_url, model=MODEL, api_key=API_KEY)
