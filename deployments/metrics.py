"""`IngressMetrics`: the replica's Prometheus metrics, named as vLLM's where they mean the same.

Family names take vLLM's form with Spout's prefix (``spout:num_requests_running`` for
``vllm:num_requests_running``), so a vLLM dashboard works once its queries say ``spout:``;
`VLLM_ALIGNED` lists those families, the others are Spout's own (docs/metrics.md maps them).

Every series carries ``model_name`` (the served model name). The replica's own series also
carry ``replica`` (its Serve replica id), so that the series of two replicas never merge
whichever replica a scrape reaches; each engine's series carry ``engine`` (its index) and are
read from the engines at scrape time, so every replica answers the same ones.

The replica's own counters and histograms live in its own `CollectorRegistry` (never the
process-global one), with ``model_name`` and ``replica`` bound when they are made: the hot
path does what it did without labels (`LoopHistogram.observe` is a bisect and two additions).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "spout:"
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
"""vLLM's buckets for ``vllm:e2e_request_latency_seconds`` (up to 16 minutes)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
REPLICA_LABELS = ("model_name", "replica")
ENGINE_LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class EngineFamily:
    """One family of the engines' statistics: one sample per engine, read at scrape time."""

    key: str  # the engine's `stats` key
    name: str  # without the ``_total`` that Prometheus adds to a counter's samples
    help_text: str
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]


ENGINE_FAMILIES = (
    EngineFamily("running", "spout:num_requests_running", "Requests the engine is running.", GaugeMetricFamily),
    EngineFamily("waiting", "spout:num_requests_waiting", "Requests waiting in the engine's queue.", GaugeMetricFamily),
    EngineFamily("preemptions", "spout:num_preemptions", "Requests preempted (to recompute later) when the KV cache ran out.", CounterMetricFamily),
    EngineFamily("prefix_cache_queried_tokens", "spout:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", CounterMetricFamily),
    EngineFamily("prefix_cache_hit_tokens", "spout:prefix_cache_hits", "Prompt tokens found in the prefix cache.", CounterMetricFamily),
    EngineFamily("draft_tokens", "spout:spec_decode_num_draft_tokens", "Draft tokens the engine proposed by prompt lookup.", CounterMetricFamily),
    EngineFamily("accepted_tokens", "spout:spec_decode_num_accepted_tokens", "Draft tokens the engine accepted.", CounterMetricFamily),
    EngineFamily("generated_tokens", "spout:engine_generation_tokens", "Tokens the engine generated.", CounterMetricFamily),
    EngineFamily("steps", "spout:engine_steps", "Steps the engine ran.", CounterMetricFamily),
    EngineFamily("step_seconds", "spout:engine_step_seconds", "Seconds the engine spent computing its steps.", CounterMetricFamily),
    EngineFamily(
        "delivery_wait_seconds",
        "spout:engine_delivery_wait_seconds",
        "Seconds the engine spent between steps handing outputs over and waiting for ingress replicas to take them.",
        CounterMetricFamily,
    ),
)
HIT_RATE = "spout:prefix_cache_hit_rate"
HIT_RATE_HELP = "Share of prompt tokens found in the prefix cache since the engine started (0 before any lookup)."
VLLM_ALIGNED = frozenset(
    {
        "spout:num_requests_running",
        "spout:num_requests_waiting",
        "spout:num_preemptions",
        "spout:prefix_cache_queries",
        "spout:prefix_cache_hits",
        "spout:spec_decode_num_draft_tokens",
        "spout:spec_decode_num_accepted_tokens",
        "spout:prompt_tokens",
        "spout:generation_tokens",
        "spout:request_success",
        "spout:time_to_first_token_seconds",
        "spout:inter_token_latency_seconds",
        "spout:e2e_request_latency_seconds",
    }
)
"""Families whose vLLM counterpart (``vllm:`` for ``spout:``, the same labels besides ``replica``) means the same."""


class ReplicaCounter:
    """A counter of the replica's, by the value of one more label (``model_name`` and ``replica`` bound)."""

    def __init__(self, name: str, help_text: str, label: str, bound: tuple[str, str], registry: CollectorRegistry) -> None:
        self.counter = Counter(name, help_text, [*REPLICA_LABELS, label], registry=registry)
        self.bound = bound
        self.children: dict[str, Counter] = {}  # by label value: `Counter.labels` takes a lock and builds a key

    def inc(self, label_value: str, amount: float = 1) -> None:
        child = self.children.get(label_value)
        if child is None:
            child = self.children[label_value] = self.counter.labels(*self.bound, label_value)
        child.inc(amount)


class LoopHistogram:
    """A Prometheus histogram for one event loop's hot path: an observation is a bisect and two
    additions (``prometheus_client``'s ``Histogram`` takes a lock and walks its buckets, about a
    microsecond per frame); the family, with its constant labels, is built when scraped."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...], registry: CollectorRegistry, labels: dict[str, str] | None = None) -> None:
        self.name, self.help_text, self.bounds = name, help_text, buckets
        self.labels = labels or {}
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def collect(self) -> Iterator[Metric]:
        cumulative, buckets = 0, []
        for bound, count in zip((*(floatToGoString(b) for b in self.bounds), "+Inf"), self.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        family = HistogramMetricFamily(self.name, self.help_text, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), buckets, self.total)
        yield family


@dataclass(frozen=True)
class ReplicaState:
    """What the replica reads at scrape time besides its counters."""

    live_choices: int  # engine requests this replica still routes
    detok_inline_share: float  # share of detok batches done inline, 1 before any


class _Scrape:
    """The registry's families, then the families read at scrape time (a `generate_latest` source)."""

    def __init__(self, registry: CollectorRegistry, families: Iterable[Metric]) -> None:
        self.registry, self.families = registry, families

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.families


def engine_families(model_name: str, engine_stats: list[dict[str, float]]) -> list[Metric]:
    """Each engine's statistics (``engine_stats[i]`` for engine ``i``): one family per statistic, a sample per engine."""
    families: list[Metric] = []
    for spec in ENGINE_FAMILIES:
        metric = spec.kind(spec.name, spec.help_text, labels=list(ENGINE_LABELS))
        for index, stats in enumerate(engine_stats):
            metric.add_metric([model_name, str(index)], stats[spec.key])
        families.append(metric)
    hit_rate = GaugeMetricFamily(HIT_RATE, HIT_RATE_HELP, labels=list(ENGINE_LABELS))
    for index, stats in enumerate(engine_stats):
        hit_rate.add_metric([model_name, str(index)], stats["prefix_cache_hit_tokens"] / max(stats["prefix_cache_queried_tokens"], 1))
    families.append(hit_rate)
    return families


class IngressMetrics:
    """One ingress replica's metrics: ``model_name`` is the served model's name, ``replica`` the
    Serve replica id (`deployments.ingress` reads it from the replica context)."""

    def __init__(self, model_name: str, replica: str) -> None:
        self.model_name, self.replica = model_name, replica
        self.registry = CollectorRegistry(auto_describe=True)
        bound = (model_name, replica)
        labels = dict(zip(REPLICA_LABELS, bound))
        self.requests = ReplicaCounter("spout:http_requests", "HTTP requests by status code.", "status", bound, self.registry)
        self.aborts = ReplicaCounter("spout:aborts", "Engine requests aborted, by cause.", "cause", bound, self.registry)
        self.routing = ReplicaCounter("spout:engine_routing", "Requests sent to an engine, by how it was chosen.", "placement", bound, self.registry)
        self.request_success = ReplicaCounter("spout:request_success", "Choices finished, by finish reason.", "finished_reason", bound, self.registry)
        self.prompt_tokens = Counter("spout:prompt_tokens", "Prompt tokens of the requests submitted.", REPLICA_LABELS, registry=self.registry).labels(*bound)
        self.generation_tokens = Counter("spout:generation_tokens", "Output tokens streamed or returned.", REPLICA_LABELS, registry=self.registry).labels(
            *bound
        )
        self.ttft = LoopHistogram("spout:time_to_first_token_seconds", "Request arrival to first output text.", LATENCY_BUCKETS_S, self.registry, labels)
        self.itl = LoopHistogram("spout:inter_token_latency_seconds", "Time between streamed deltas, per token.", LATENCY_BUCKETS_S, self.registry, labels)
        self.e2e = LoopHistogram("spout:e2e_request_latency_seconds", "Request arrival to its last output.", REQUEST_LATENCY_BUCKETS_S, self.registry, labels)
        self.detok_batch = LoopHistogram("spout:detok_batch_requests", "Requests per detokenizer batch.", BATCH_BUCKETS, self.registry, labels)

    def render(self, engine_stats: list[dict[str, float]], replica: ReplicaState) -> bytes:
        """Prometheus text: this replica's metrics, each engine's statistics (``engine_stats[i]`` for engine ``i``), and ``replica``."""
        families = engine_families(self.model_name, engine_stats)
        labels, values = list(REPLICA_LABELS), [self.model_name, self.replica]
        live = GaugeMetricFamily("spout:live_choices", "Engine requests this replica still routes.", labels=labels)
        live.add_metric(values, replica.live_choices)
        inline = GaugeMetricFamily("spout:detok_inline_share", "Share of detokenizer batches done inline in the ingress.", labels=labels)
        inline.add_metric(values, replica.detok_inline_share)
        families += [live, inline]
        return generate_latest(_Scrape(self.registry, families))  # type: ignore[arg-type]
