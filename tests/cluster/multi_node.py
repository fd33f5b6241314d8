"""A multi-node Ray cluster on loopback running Spout, driven from its own process (one Ray
cluster per process): ``python -m tests.cluster.multi_node`` prints a JSON report on its last line.

Nodes (`ray.cluster_utils.Cluster`, several raylets on this machine, every address on loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray from swapping 127.0.0.1 for the machine's
address; ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, so each ingress replica serves HTTP on its own
port, as docs/deployment.md recommends): a head (Serve's controller, one ingress replica), a node for the
other ingress replica (``spout_ingress``), two nodes offering ``spout_engine`` (standing in for GPUs:
one engine each) and two CPU-only nodes offering ``spout_detok`` (the detokenizer replicas).
Steps:

1. placement, read from Ray's state API;
2. ``STREAMS`` concurrent streams, each against its non-streaming twin; each engine's subscribers;
3. the node of one detokenizer replica removed in the middle of ``FAILURE_STREAMS`` streams;
4. the node of one engine removed in the middle of ``FAILURE_STREAMS`` streams; new requests
   after it; a node with ``spout_engine`` joining again, and requests once the engine is back;
5. the second ingress replica's node removed in the middle of long streams: the others finish,
   and the engines end the dead replica's requests.

``SPOUT_E2E_FULL=1`` runs 64 and 128 streams; the default is a reduced size for CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import httpx
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from bench.lib.serve_cluster import free_port
from deployments import build_app
from deployments.engine_placement import app_engine

FULL = os.environ.get("SPOUT_E2E_FULL") == "1"
STREAMS = 64 if FULL else 24
FAILURE_STREAMS = 128 if FULL else 32
MAX_TOKENS = 48
ENGINE, DETOK, INGRESS = "spout_engine", "spout_detok", "spout_ingress"
LONG_TOKENS = 400  # still streaming when the node goes, which is right after the first text
APP = "spout"
LOOPBACK = "127.0.0.1"
TIMEOUT_S = 240
STARTED = time.monotonic()


def prompt(i: int) -> str:
    return f"Request {i}: " + " ".join(f"word{(i * 7 + k) % 50}" for k in range(5 + i % 7))


async def complete(client: httpx.AsyncClient, i: int) -> str:
    body = {"model": "tiny-random", "prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0}
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


async def stream(client: httpx.AsyncClient, i: int, started: asyncio.Event | None = None, max_tokens: int = MAX_TOKENS) -> dict:
    """A streamed completion read line by line: its text, or the error frame that ended it."""
    body = {"model": "tiny-random", "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": max_tokens > MAX_TOKENS}
    text, error = "", None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:  # refused before streaming: the code from the error JSON
                refusal = json.loads(await response.aread())["error"]
                return {"text": "", "error": f"HTTP {response.status_code} {refusal.get('code')}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frame = json.loads(line[6:])
                if "error" in frame:
                    error = frame["error"].get("code") or frame["error"].get("message")
                    continue
                text += frame["choices"][0]["text"] if frame["choices"] else ""
                if started is not None and text:
                    started.set()
    except httpx.HTTPError as failure:
        error = f"connection: {type(failure).__name__}"
    return {"text": text, "error": error}


def placement(node_names: dict[str, str]) -> dict[str, list[str]]:
    """Which of our nodes each live actor of ours runs on, by kind."""
    kinds: dict[str, list[str]] = {"engine": [], "detok": [], "ingress": []}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000):
        name = actor.class_name
        kind = "engine" if name == "EngineActor" else "detok" if name.endswith(":Detokenizer") else "ingress" if name.endswith(":Ingress") else None
        if kind is not None:
            kinds[kind].append(node_names.get(actor.node_id, "unknown"))
    return {kind: sorted(nodes) for kind, nodes in kinds.items()}


async def wait_until(predicate, timeout_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.5)
    return False


class Clients:
    """One HTTP client per ingress replica; request ``i`` goes to replica ``i % 2`` (head first)."""

    def __init__(self, ports: dict[str, int]) -> None:
        limits = httpx.Limits(max_connections=512)
        self.by_node = {node: httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{port}", timeout=TIMEOUT_S, limits=limits) for node, port in ports.items()}
        self.order = [self.by_node["head"], self.by_node["ingress"]]

    def __call__(self, i: int) -> httpx.AsyncClient:
        return self.order[i % 2]

    async def aclose(self) -> None:
        for client in self.by_node.values():
            await client.aclose()


async def gather_within(tasks: list[asyncio.Task], timeout_s: float) -> list[dict]:
    """The streams' results, waiting at most ``timeout_s``: one still open then counts as
    ``"hung"`` (and is cancelled), and the streams still open are listed every 10 s on stderr."""
    deadline = time.monotonic() + timeout_s
    pending = set(tasks)
    while pending and time.monotonic() < deadline:
        _, pending = await asyncio.wait(pending, timeout=min(10.0, deadline - time.monotonic()))
        if pending:
            progress(f"{len(pending)} streams still open: {sorted(tasks.index(t) for t in pending)}")
    for task in pending:
        task.cancel()
    return [{"text": "", "error": "hung"} if task in pending else task.result() for task in tasks]


async def remove_mid_stream(cluster: Cluster, node, clients: Clients, twins: dict[int, str], first: int) -> list[dict]:
    """``FAILURE_STREAMS`` streams over both ingress replicas; ``node`` is removed once one has text."""
    started = asyncio.Event()
    tasks = [asyncio.create_task(stream(clients(i), first + i, started)) for i in range(FAILURE_STREAMS)]
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    cluster.remove_node(node, allow_graceful=False)
    results = await gather_within(tasks, TIMEOUT_S)
    return [{"index": first + i, **r, "exact": r["text"] == twins[first + i]} for i, r in enumerate(results)]


def ingress_ports(node_names: dict[str, str]) -> dict[str, int]:
    """The direct-ingress port of the ingress replica on each of our nodes."""
    controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    replica_nodes = {
        a.name: node_names.get(a.node_id) for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000) if a.class_name.endswith(":Ingress")
    }
    ports = {}
    for group in ray.get(controller.get_target_groups.remote(APP)):
        if group.protocol.value == "HTTP":
            for target in group.targets:
                node = next((n for name, n in replica_nodes.items() if target.name in name), None)
                if node is not None:
                    ports[node] = target.port
    return ports


async def scenario(cluster: Cluster, nodes: dict[str, object]) -> dict:
    node_names = {node.node_id: name for name, node in nodes.items()}
    clients = Clients(await wait_healthy(node_names))
    progress("both ingress replicas healthy")
    report: dict = {"placement": placement(node_names)}
    try:
        report.update(await serve_and_lose_nodes(cluster, nodes, node_names, clients))
        progress("removing an ingress node")
        report.update(await remove_ingress(cluster, nodes["ingress"], clients))
    finally:
        await clients.aclose()
    return report


async def serve_and_lose_nodes(cluster: Cluster, nodes: dict[str, object], node_names: dict[str, str], clients: Clients) -> dict:
    """Steps 2 to 4 of the module docstring."""
    report: dict = {}
    total = STREAMS + 2 * FAILURE_STREAMS
    twins = dict(enumerate(await asyncio.gather(*(complete(clients(i), i) for i in range(total)))))
    streamed = await asyncio.gather(*(stream(clients(i), i) for i in range(STREAMS)))
    report["streams"] = [{"index": i, **r, "exact": r["text"] == twins[i]} for i, r in enumerate(streamed)]
    report["subscribers"] = [(await engine(i).stats.remote())["subscribers"] for i in range(2)]

    progress("streams done; removing a detok node")
    detok_node = nodes[placement(node_names)["detok"][0]]
    report["detok_node_removed"] = await remove_mid_stream(cluster, detok_node, clients, twins, STREAMS)

    progress("removing an engine node")
    engine_node = nodes[placement(node_names)["engine"][0]]
    report["engine_node_removed"] = await remove_mid_stream(cluster, engine_node, clients, twins, STREAMS + FAILURE_STREAMS)
    after = await asyncio.gather(*(stream(clients(i), i) for i in range(8)))
    report["after_engine_loss"] = [{"index": i, **r, "exact": r["text"] == twins[i]} for i, r in enumerate(after)]

    nodes["engine-again"] = cluster.add_node(num_cpus=1, resources={ENGINE: 1}, node_ip_address=LOOPBACK)
    node_names[nodes["engine-again"].node_id] = "engine-again"

    async def both_engines_ready() -> bool:
        try:
            await asyncio.wait_for(asyncio.gather(engine(0).ready.remote(), engine(1).ready.remote()), 5)
            return True
        except Exception:  # noqa: BLE001 - still restarting
            return False

    progress("an engine node joins")
    report["engine_back"] = await wait_until(both_engines_ready)
    progress("both engines ready")
    report["placement_after"] = placement(node_names)
    late = await asyncio.gather(*(stream(clients(i), i) for i in range(16)))
    report["after_engine_back"] = [{"index": i, **r, "exact": r["text"] == twins[i]} for i, r in enumerate(late)]
    return report


def progress(step: str) -> None:
    """The step reached and the seconds since the scenario began, on stderr (what pytest shows on a failure)."""
    print(f"{time.monotonic() - STARTED:6.1f} s: {step}", file=sys.stderr, flush=True)


def engine(index: int):
    return app_engine(APP, index)


async def remove_ingress(cluster: Cluster, node, clients: Clients) -> dict:
    """Long streams over both ingress replicas; the second replica's node goes. Then: how the
    streams ended per replica, whether the first still serves, and whether the engines are left
    running anything (they end a silent subscriber's requests, `deployments.engine_actor`)."""
    started = asyncio.Event()
    tasks = [asyncio.create_task(stream(clients(i), i, started, LONG_TOKENS)) for i in range(FAILURE_STREAMS)]
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    cluster.remove_node(node, allow_graceful=False)
    progress("ingress node removed")
    results = await gather_within(tasks, TIMEOUT_S)
    served_after = await stream(clients(0), 0)

    async def engines_idle() -> bool:
        stats = await asyncio.gather(*(engine(i).stats.remote() for i in range(2)))
        return all(s["running"] == 0 and s["waiting"] == 0 for s in stats)

    return {
        "ingress_node_removed": [
            {"replica": "head" if i % 2 == 0 else "ingress", "tokens_text": len(r["text"]), "error": r["error"]} for i, r in enumerate(results)
        ],
        "served_after_ingress_loss": served_after,
        "engines_idle_after_ingress_loss": await wait_until(engines_idle, 120),
    }


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {INGRESS: 1},
            "node_ip_address": LOOPBACK,
            "include_dashboard": True,  # Ray's state API reads through it
            "dashboard_host": LOOPBACK,
            "dashboard_port": free_port(),
        },
    )
    nodes = {"head": cluster.head_node, "ingress": cluster.add_node(num_cpus=1, resources={INGRESS: 1}, node_ip_address=LOOPBACK)}
    for n in range(2):
        nodes[f"engine-{n}"] = cluster.add_node(num_cpus=1, resources={ENGINE: 1}, node_ip_address=LOOPBACK)
    for n in range(2):
        nodes[f"detok-{n}"] = cluster.add_node(num_cpus=2, resources={DETOK: 1}, node_ip_address=LOOPBACK)
    ray.init(address=f"{LOOPBACK}:{cluster.address.rsplit(':', 1)[1]}", _node_ip_address=LOOPBACK, log_to_driver=False)
    try:
        serve.start(http_options={"host": LOOPBACK, "port": free_port(), "location": "HeadOnly"}, logging_config={"enable_access_log": False})
        app = build_app(
            {
                "model": "tiny-random",
                "engine_resource": ENGINE,
                "detok_resource": DETOK,
                "ingress_resource": INGRESS,
                "ingress_min_replicas": 2,
                "ingress_max_replicas": 2,
                "detok_min_replicas": 2,
                "inline_detok_threshold": 0,
                "max_num_seqs": 128,
            }
        )
        progress("cluster up")
        serve.run(app, name=APP, route_prefix="/", blocking=False)
        report = asyncio.run(scenario(cluster, nodes))
    finally:
        progress("shutting down")
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        progress("shut down")
    print(json.dumps(report))


async def wait_healthy(node_names: dict[str, str]) -> dict[str, int]:
    """Both ingress replicas' direct-ingress ports, once each answers /health."""
    ports: dict[str, int] = {}

    async def healthy() -> bool:
        nonlocal ports
        ports = ingress_ports(node_names)
        if set(ports) != {"head", "ingress"}:
            return False
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                codes = [(await client.get(f"http://{LOOPBACK}:{port}/health")).status_code for port in ports.values()]
        except httpx.HTTPError:
            return False
        return codes == [200, 200]

    if not await wait_until(healthy, 600):
        raise RuntimeError(f"the app did not become healthy (ingress ports {ports})")
    return ports


if __name__ == "__main__":
    main()
