"""`IngressMetrics`: the replica's Prometheus metrics, built with ``prometheus_client``.

The replica's own counters and histograms live in its own `CollectorRegistry` (never the
process-global one). ``/metrics`` adds families read at scrape time: one gauge or counter
family per engine statistic, with one sample per engine (label ``engine``), so the text has
one ``HELP``/``TYPE`` per family whatever the number of engines.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# (stats key, family name, help, kind) for the engines' statistics, one sample per engine.
ENGINE_FAMILIES = (
    ("running", "spout_running_requests", "Requests the engine is running.", GaugeMetricFamily),
    ("waiting", "spout_waiting_requests", "Requests waiting in the engine's queue.", GaugeMetricFamily),
    ("generated_tokens", "spout_engine_generated_tokens", "Tokens the engine generated.", CounterMetricFamily),
    ("draft_tokens", "spout_engine_draft_tokens", "Draft tokens the engine proposed by prompt lookup.", CounterMetricFamily),
    ("accepted_tokens", "spout_engine_accepted_tokens", "Draft tokens the engine accepted.", CounterMetricFamily),
    ("prefix_cache_queried_tokens", "spout_engine_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache.", CounterMetricFamily),
    ("prefix_cache_hit_tokens", "spout_engine_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache.", CounterMetricFamily),
    ("preemptions", "spout_engine_preemptions", "Requests preempted (to recompute later) when the KV cache ran out.", CounterMetricFamily),
    ("steps", "spout_engine_steps", "Steps the engine ran.", CounterMetricFamily),
    ("step_seconds", "spout_engine_step_seconds", "Seconds the engine spent computing its steps.", CounterMetricFamily),
    (
        "delivery_wait_seconds",
        "spout_engine_delivery_wait_seconds",
        "Seconds the engine spent between steps handing outputs over and waiting for ingress replicas to take them.",
        CounterMetricFamily,
    ),
)
HIT_RATE_HELP = "Share of prompt tokens found in the prefix cache since the engine started (0 before any lookup)."


class LabeledCounter:
    """A counter with one label, counted by label value."""

    def __init__(self, name: str, help_text: str, label: str, registry: CollectorRegistry) -> None:
        self.counter = Counter(name, help_text, [label], registry=registry)

    def inc(self, label_value: str, amount: float = 1) -> None:
        self.counter.labels(label_value).inc(amount)


class LoopHistogram:
    """A Prometheus histogram for one event loop's hot path: an observation is a bisect and two
    additions (``prometheus_client``'s ``Histogram`` takes a lock and walks its buckets, about a
    microsecond per frame); the family is built when scraped."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.help_text, self.bounds = name, help_text, buckets
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
        yield HistogramMetricFamily(self.name, self.help_text, buckets=buckets, sum_value=self.total)


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


class IngressMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = LabeledCounter("spout_requests_total", "HTTP requests by status code.", "status", self.registry)
        self.aborts = LabeledCounter("spout_aborts_total", "Engine requests aborted, by cause.", "cause", self.registry)
        self.tokens = LabeledCounter("spout_tokens_total", "Prompt and output tokens.", "kind", self.registry)
        self.ttft = LoopHistogram("spout_time_to_first_token_seconds", "Request arrival to first output text.", LATENCY_BUCKETS_S, self.registry)
        self.itl = LoopHistogram("spout_inter_token_latency_seconds", "Time between streamed deltas, per token.", LATENCY_BUCKETS_S, self.registry)
        self.detok_batch = LoopHistogram("spout_detok_batch_requests", "Requests per detokenizer batch.", BATCH_BUCKETS, self.registry)

    def render(self, engine_stats: list[dict[str, float]], replica: ReplicaState) -> bytes:
        """Prometheus text: this replica's metrics, each engine's statistics (``engine_stats[i]`` for engine ``i``), and ``replica``."""
        families: list[Metric] = []
        for key, name, help_text, family in ENGINE_FAMILIES:
            metric = family(name, help_text, labels=["engine"])
            for index, stats in enumerate(engine_stats):
                metric.add_metric([str(index)], stats[key])
            families.append(metric)
        hit_rate = GaugeMetricFamily("spout_engine_prefix_cache_hit_rate", HIT_RATE_HELP, labels=["engine"])
        for index, stats in enumerate(engine_stats):
            hit_rate.add_metric([str(index)], stats["prefix_cache_hit_tokens"] / max(stats["prefix_cache_queried_tokens"], 1))
        families.append(hit_rate)
        families.append(GaugeMetricFamily("spout_live_choices", "Engine requests this replica still routes.", value=replica.live_choices))
        families.append(
            GaugeMetricFamily("spout_detok_inline_share", "Share of detokenizer batches done inline in the ingress.", value=replica.detok_inline_share)
        )
        return generate_latest(_Scrape(self.registry, families))  # type: ignore[arg-type]
