"""Ingress replicas that autoscale on their own load, and drain when they go (issue 29, items 4
and 7). One local Ray cluster per front as ``make run`` serves it (the replicas' own server, which
counts its requests for Serve's autoscaler itself, and HAProxy in front of the replicas' own ports),
``tiny-random``, the ingress between one and two replicas at a target of 4 streams:

1. 16 clients streaming one completion after another: Serve adds the second replica; once they have
   stopped, it removes one;
2. 4 long streams, and a redeploy with another ingress option while they run: Serve replaces the
   ingress replica, and the old one drains: every stream ends with all its tokens and ``[DONE]``,
   and the new replica serves.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from ray import serve

from bench.lib.serve_cluster import FRONTS, ReplicaWatcher, ServeCluster, front_options
from deployments import build_app
from deployments.driver import wait_until_healthy

APP = "spout"
TARGET_STREAMS = 4
OPTIONS = {
    "model": "tiny-random",
    "max_num_seqs": "32",
    "detok_min_replicas": "0",
    "ingress_min_replicas": "1",
    "ingress_max_replicas": "2",
    "ingress_target_streams": str(TARGET_STREAMS),
    "ingress_upscale_delay_s": "0",
    "ingress_downscale_delay_s": "2",
}
SCALE_OUT_STREAMS, SCALE_OUT_TOKENS = 16, 200
DRAINED_STREAMS, DRAINED_TOKENS = TARGET_STREAMS, 600
"""Long enough that the old replica is stopping before they end, short enough to end within its drain (60 s) on a loaded machine."""
TIMEOUT_S = 300.0


def stream(port: int, max_tokens: int, began: threading.Semaphore | None = None) -> tuple[int, bool]:
    """One streamed completion on a connection of its own: (completion tokens from the usage frame,
    whether ``[DONE]`` came). ``began`` is released at its first frame."""
    body = {"model": "tiny-random", "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    tokens, done = 0, False
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=TIMEOUT_S) as response:
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                tokens = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", tokens)
                if began is not None and tokens == 0:
                    began.release()
                    began = None
    return tokens, done


def keep_streaming(port: int, enough: threading.Event) -> list[tuple[int, bool]]:
    """Streams of `SCALE_OUT_TOKENS`, one after another until ``enough`` is set: the load lasts until Serve
    has scaled out, however fast the engine ends each stream (a fixed set of streams once ended before
    the replica's metrics reached the autoscaler, and no replica was added); each stream's end."""
    ends = []
    while not enough.is_set():
        ends.append(stream(port, SCALE_OUT_TOKENS))
    return ends


@pytest.mark.parametrize("front", ["replica", "serve"])
def test_the_ingress_scales_out_and_in_and_a_replaced_replica_finishes_its_streams(front):
    with ServeCluster(FRONTS[front]) as cluster:
        options = OPTIONS | front_options(front, cluster.port)
        port = cluster.deploy(build_app(options), APP)
        wait_until_healthy(f"http://127.0.0.1:{port}", TIMEOUT_S)
        with ReplicaWatcher(APP, "Ingress", period_s=0.5) as watcher, ThreadPoolExecutor(SCALE_OUT_STREAMS) as pool:
            watcher.phase = "streams"
            enough = threading.Event()
            scale_out = [pool.submit(keep_streaming, port, enough) for _ in range(SCALE_OUT_STREAMS)]
            try:
                scaled_out = watcher.wait_for(2, TIMEOUT_S)
            finally:
                enough.set()
            assert scaled_out is not None, watcher.timeline
            for ends in (s.result(timeout=TIMEOUT_S) for s in scale_out):
                assert ends and set(ends) == {(SCALE_OUT_TOKENS, True)}
            watcher.phase = "idle"
            assert watcher.wait_for(1, TIMEOUT_S) is not None, watcher.timeline

            watcher.phase = "redeploy"
            began = threading.Semaphore(0)
            drained = [pool.submit(stream, port, DRAINED_TOKENS, began) for _ in range(DRAINED_STREAMS)]
            for _ in drained:
                assert began.acquire(timeout=TIMEOUT_S)
            # serve.run returns once the old replica is gone, which is after the streams end.
            redeploy = pool.submit(serve.run, build_app(options | {"max_stop_strings": "7"}), name=APP, route_prefix="/", blocking=False)
            assert replaced_while_streaming(drained), "the streams ended before the old replica was stopping: make them longer"
            ends = [s.result(timeout=TIMEOUT_S) for s in drained]
            assert ends == [(DRAINED_TOKENS, True)] * DRAINED_STREAMS, watcher.timeline
            redeploy.result(timeout=TIMEOUT_S)
        wait_until_healthy(f"http://127.0.0.1:{port}", TIMEOUT_S)
        assert stream(port, 8) == (8, True)


def replaced_while_streaming(streams: list[Future]) -> bool:
    """Whether an ingress replica was stopping (replaced, draining) before every stream had ended."""
    deadline = time.monotonic() + TIMEOUT_S
    while not all(s.done() for s in streams) and time.monotonic() < deadline:
        if serve.status().applications[APP].deployments["Ingress"].replica_states.get("STOPPING"):
            return True
        time.sleep(0.2)
    return False
