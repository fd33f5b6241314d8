"""/metrics is valid Prometheus text with two engines: one HELP and TYPE per family, a sample per
engine; vLLM's family names with Spout's prefix; ``model_name`` on every series, ``replica`` on the
replica's own, ``engine`` on each engine's."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deployments.metrics import BATCH_BUCKETS, ENGINE_FAMILIES, LATENCY_BUCKETS_S, VLLM_ALIGNED, IngressMetrics, LoopHistogram, ReplicaState

MODEL = "my-model"
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
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _scrape(replica: str = "replica-a") -> str:
    metrics = IngressMetrics(MODEL, replica)
    metrics.requests.inc("200")
    metrics.requests.inc("200")
    metrics.requests.inc("400")
    metrics.prompt_tokens.inc(9)
    metrics.generation_tokens.inc(17)
    metrics.request_success.inc("length")
    metrics.ttft.observe(0.03)
    metrics.e2e.observe(0.4)
    metrics.detok_batch.observe(8)
    return metrics.render(ENGINE_STATS, ReplicaState(live_choices=4, detok_inline_share=0.5)).decode()


def _families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _samples(family, suffix: str = "") -> list:
    return [s for s in family.samples if s.name == family.name + suffix]


def test_every_family_once_with_a_sample_per_engine():
    text = _scrape()
    families = _families(text)
    declared = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE"))
    assert declared and max(declared.values()) == 1
    assert Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP")) == declared
    for spec in ENGINE_FAMILIES:
        suffix = "_total" if families[spec.name].type == "counter" else ""
        samples = {s.labels["engine"]: s.value for s in _samples(families[spec.name], suffix)}
        assert samples == {"0": ENGINE_STATS[0][spec.key], "1": ENGINE_STATS[1][spec.key]}
    assert families["spout:engine_generation_tokens"].type == "counter" and families["spout:num_requests_running"].type == "gauge"
    hit_rate = {s.labels["engine"]: s.value for s in families["spout:prefix_cache_hit_rate"].samples}
    assert hit_rate == {"0": 0.25, "1": 0.0}


def test_replica_metrics():
    families = _families(_scrape())
    requests = {s.labels["status"]: s.value for s in _samples(families["spout:http_requests"], "_total")}
    assert requests == {"200": 2.0, "400": 1.0}
    assert [s.value for s in _samples(families["spout:prompt_tokens"], "_total")] == [9]
    assert [s.value for s in _samples(families["spout:generation_tokens"], "_total")] == [17]
    assert {s.labels["finished_reason"]: s.value for s in _samples(families["spout:request_success"], "_total")} == {"length": 1}
    assert families["spout:live_choices"].samples[0].value == 4
    assert families["spout:detok_inline_share"].samples[0].value == 0.5
    buckets = {s.labels["le"]: s.value for s in _samples(families["spout:time_to_first_token_seconds"], "_bucket")}
    assert buckets["0.025"] == 0 and buckets["0.05"] == 1 and buckets["+Inf"] == 1
    e2e = {s.labels["le"]: s.value for s in _samples(families["spout:e2e_request_latency_seconds"], "_bucket")}
    assert e2e["0.3"] == 0 and e2e["0.5"] == 1


def test_every_series_carries_model_name_and_replica_or_engine():
    for family in _families(_scrape()).values():
        for sample in family.samples:
            assert sample.labels["model_name"] == MODEL, sample
            if family.name in {spec.name for spec in ENGINE_FAMILIES} | {"spout:prefix_cache_hit_rate"}:
                assert "replica" not in sample.labels and sample.labels["engine"] in {"0", "1"}, sample
            else:
                assert "engine" not in sample.labels and sample.labels["replica"] == "replica-a", sample


def test_two_replicas_series_never_merge():
    """Two replicas' texts, as a load balancer hands them to one scraper: every replica series stays distinct."""
    first, second = _families(_scrape("replica-a")), _families(_scrape("replica-b"))
    for name, family in first.items():
        if not family.samples or "replica" not in family.samples[0].labels:
            continue  # none yet, or an engine's series: every replica reads the same engines
        keys = {(s.name, tuple(sorted(s.labels.items()))) for s in family.samples}
        assert keys.isdisjoint((s.name, tuple(sorted(s.labels.items()))) for s in second[name].samples), name


def test_names_take_vllms_form():
    for family in _families(_scrape()).values():
        assert re.fullmatch(r"spout:[a-z0-9_]+", family.name), family.name
    assert VLLM_ALIGNED <= _families(_scrape()).keys()


def test_each_replica_has_its_own_registry():
    first, second = IngressMetrics(MODEL, "a"), IngressMetrics(MODEL, "b")  # the global registry would refuse the second
    first.requests.inc("200")
    families = _families(second.render([], ReplicaState(0, 1.0)).decode())
    assert families["spout:http_requests"].samples == []


def test_loop_histogram_scrapes_as_prometheus_client_histogram():
    for buckets, values in ((LATENCY_BUCKETS_S, [0.0, 0.005, 0.0051, 0.3, 30.0, 31.0, 0.01]), (BATCH_BUCKETS, [1, 2, 3, 256, 2000])):
        ours, theirs = CollectorRegistry(), CollectorRegistry()
        loop_histogram = LoopHistogram("h_seconds", "help", buckets, ours, {"model_name": MODEL})
        histogram = Histogram("h_seconds", "help", ["model_name"], buckets=buckets, registry=theirs).labels(MODEL)
        for value in values:
            loop_histogram.observe(value)
            histogram.observe(value)
        expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
        assert generate_latest(ours).decode().splitlines() == expected


def test_docs_metrics_lists_every_family_and_its_vllm_counterpart():
    page = DOCS.read_text()
    listed = set(re.findall(r"`(spout:\w+)`", page))
    for family in text_string_to_metric_families(_scrape()):
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation time of each counter
        assert {family.name, f"{family.name}_total"} & listed, family.name
    mapping = dict(re.findall(r"^\| `(spout:\w+)` \| `(vllm:\w+)` \|", page, re.MULTILINE))
    assert {name.removesuffix("_total") for name in mapping} == VLLM_ALIGNED
    for spout, vllm in mapping.items():
        assert vllm == spout.replace("spout:", "vllm:", 1), spout
