"""Spout on a multi-node Ray cluster (several raylets on loopback): placement, exact streams, and
losing a detokenizer node, an engine node and an ingress node under load (`tests.cluster.multi_node`,
run in its own process since a process joins one Ray cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_TIMEOUT_S = 900
ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every Ray address stays on loopback
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",  # each ingress replica on its own port, as docs/deployment.md recommends
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    # A removed node is declared dead after about 2 s instead of Ray's 15 s (3 s period x 5 misses).
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "4",
}


@pytest.fixture(scope="module")
def report() -> dict:
    """The scenario's report; its Ray files (sessions, the cluster address file that a later
    ``ray.init()`` would otherwise connect to) go to a temporary directory of its own."""
    temp_dir = tempfile.mkdtemp(prefix="spout-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.cluster.multi_node"],
            cwd=ROOT,
            env=os.environ | ENV | {"RAY_TMPDIR": temp_dir},
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def exact_and_clean(streams: list[dict]) -> bool:
    return all(s["exact"] and s["error"] is None for s in streams)


def test_placement_follows_the_resources(report: dict) -> None:
    placement = report["placement"]
    assert placement["engine"] == ["engine-0", "engine-1"]  # one engine per spout_engine node
    assert len(placement["detok"]) == 2 and set(placement["detok"]) <= {"detok-0", "detok-1"}
    assert placement["ingress"] == ["head", "ingress"]
    assert report["subscribers"] == [2, 2], "every ingress replica serves every engine"


def test_streams_equal_their_non_streaming_twins(report: dict) -> None:
    assert exact_and_clean(report["streams"])


def test_losing_a_detokenizer_node_loses_no_stream(report: dict) -> None:
    assert exact_and_clean(report["detok_node_removed"])
    assert all(node.startswith("detok-") for node in report["placement_after"]["detok"])


def test_losing_an_engine_node_fails_only_its_streams(report: dict) -> None:
    streams = report["engine_node_removed"]
    failed = [s for s in streams if s["error"] is not None]
    assert failed and len(failed) < len(streams), "both engines had streams"
    # an error frame mid-stream, or a 503 for a request that reached the engine as it went; never a dropped connection
    assert all(s["error"] in ("engine_failed", "HTTP 503 engine_failed") for s in failed), failed
    assert all(s["exact"] for s in streams if s["error"] is None)
    assert exact_and_clean(report["after_engine_loss"]), "new requests go to the surviving engine"


def test_capacity_returns_when_an_engine_node_joins(report: dict) -> None:
    assert report["engine_back"]
    assert sorted(report["placement_after"]["engine"]) == ["engine-1", "engine-again"]
    assert exact_and_clean(report["after_engine_back"])


def test_losing_an_ingress_node_leaves_the_other_replica_serving(report: dict) -> None:
    streams = report["ingress_node_removed"]
    assert all(s["error"] is None and s["tokens_text"] > 0 for s in streams if s["replica"] == "head")
    assert all(s["error"] is not None for s in streams if s["replica"] == "ingress")
    assert report["served_after_ingress_loss"]["error"] is None
    assert report["engines_idle_after_ingress_loss"], "the dead replica's requests were aborted in the engines"
