"""/metrics is valid Prometheus text with two engines: one HELP and TYPE per family, a sample per engine."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deployments.metrics import BATCH_BUCKETS, ENGINE_FAMILIES, LATENCY_BUCKETS_S, IngressMetrics, LoopHistogram, ReplicaState

PREFIX_CACHE = {"prefix_cache_queried_tokens": 400, "prefix_cache_hit_tokens": 100, "preemptions": 2}
NO_LOOKUPS = {"prefix_cache_queried_tokens": 0, "prefix_cache_hit_tokens": 0, "preemptions": 0}
ENGINE_STATS = [
    {
        "running": 3,
        "waiting": 1,
        "generated_tokens": 120,
        "draft_tokens": 10,
        "accepted_tokens": 7,
        "steps": 40,
        "step_seconds": 2.5,
        "delivery_wait_seconds": 0.25,
    }
    | PREFIX_CACHE,
    {"running": 0, "waiting": 0, "generated_tokens": 5, "draft_tokens": 0, "accepted_tokens": 0, "steps": 5, "step_seconds": 0.5, "delivery_wait_seconds": 0.0}
    | NO_LOOKUPS,
]


def _scrape() -> str:
    metrics = IngressMetrics()
    metrics.requests.inc("200")
    metrics.requests.inc("200")
    metrics.requests.inc("400")
    metrics.tokens.inc("output", 17)
    metrics.ttft.observe(0.03)
    metrics.detok_batch.observe(8)
    return metrics.render(ENGINE_STATS, ReplicaState(live_choices=4, detok_inline_share=0.5)).decode()


def test_every_family_once_with_a_sample_per_engine():
    text = _scrape()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    declared = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE"))
    assert declared and max(declared.values()) == 1
    assert Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP")) == declared
    for key, name, _, _ in ENGINE_FAMILIES:
        samples = {s.labels["engine"]: s.value for s in families[name].samples if not s.name.endswith("_created")}
        assert samples == {"0": ENGINE_STATS[0][key], "1": ENGINE_STATS[1][key]}
    assert families["spout_engine_generated_tokens"].type == "counter" and families["spout_running_requests"].type == "gauge"
    hit_rate = {s.labels["engine"]: s.value for s in families["spout_engine_prefix_cache_hit_rate"].samples}
    assert hit_rate == {"0": 0.25, "1": 0.0}


def test_replica_metrics():
    families = {family.name: family for family in text_string_to_metric_families(_scrape())}
    requests = {s.labels["status"]: s.value for s in families["spout_requests"].samples if s.name == "spout_requests_total"}
    assert requests == {"200": 2.0, "400": 1.0}
    assert families["spout_live_choices"].samples[0].value == 4
    assert families["spout_detok_inline_share"].samples[0].value == 0.5
    buckets = {s.labels["le"]: s.value for s in families["spout_time_to_first_token_seconds"].samples if s.name.endswith("_bucket")}
    assert buckets["0.025"] == 0 and buckets["0.05"] == 1 and buckets["+Inf"] == 1


def test_each_replica_has_its_own_registry():
    first, second = IngressMetrics(), IngressMetrics()  # the global registry would refuse the second
    first.requests.inc("200")
    families = {family.name: family for family in text_string_to_metric_families(second.render([], ReplicaState(0, 1.0)).decode())}
    assert families["spout_requests"].samples == []


def test_loop_histogram_scrapes_as_prometheus_client_histogram():
    for buckets, values in ((LATENCY_BUCKETS_S, [0.0, 0.005, 0.0051, 0.3, 30.0, 31.0, 0.01]), (BATCH_BUCKETS, [1, 2, 3, 256, 2000])):
        ours, theirs = CollectorRegistry(), CollectorRegistry()
        loop_histogram = LoopHistogram("h_seconds", "help", buckets, ours)
        histogram = Histogram("h_seconds", "help", buckets=buckets, registry=theirs)
        for value in values:
            loop_histogram.observe(value)
            histogram.observe(value)
        expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
        assert generate_latest(ours).decode().splitlines() == expected


def test_docs_metrics_lists_every_family():
    page = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"`(spout_\w+)`", page))
    for family in text_string_to_metric_families(_scrape()):
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation time of each counter and histogram
        assert {family.name, f"{family.name}_total"} & listed, family.name
