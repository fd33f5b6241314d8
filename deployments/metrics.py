"""Prometheus text exposition for the ingress: counters and histograms, no client library."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip([*self.buckets, "+Inf"], self.counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {cumulative}')
        lines += [f"{self.name}_sum {self.total}", f"{self.name}_count {cumulative}"]
        return lines


class LabeledCounter:
    def __init__(self, name: str, help_text: str, label: str) -> None:
        self.name, self.help, self.label = name, help_text, label
        self.values: Counter[str] = Counter()

    def inc(self, label_value: str, amount: int = 1) -> None:
        self.values[label_value] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        return lines + [f'{self.name}{{{self.label}="{value}"}} {count}' for value, count in sorted(self.values.items())]


class IngressMetrics:
    def __init__(self) -> None:
        self.requests = LabeledCounter("spout_requests_total", "HTTP requests by status code.", "status")
        self.aborts = LabeledCounter("spout_aborts_total", "Engine requests aborted, by cause.", "cause")
        self.tokens = LabeledCounter("spout_tokens_total", "Prompt and output tokens.", "kind")
        self.ttft = Histogram("spout_time_to_first_token_seconds", "Request arrival to first output text.", LATENCY_BUCKETS_S)
        self.itl = Histogram("spout_inter_token_latency_seconds", "Time between streamed deltas, per token.", LATENCY_BUCKETS_S)
        self.detok_batch = Histogram("spout_detok_batch_requests", "Requests per detokenizer batch.", BATCH_BUCKETS)

    def render(self, gauges: dict[str, float], counters: dict[str, float]) -> str:
        """This replica's metrics, then ``gauges`` and ``counters`` read from elsewhere (the engines)."""
        lines: list[str] = []
        for metric in (self.requests, self.aborts, self.tokens, self.ttft, self.itl, self.detok_batch):
            lines += metric.render()
        for kind, values in (("gauge", gauges), ("counter", counters)):
            for name, value in values.items():
                lines += [f"# TYPE {name.split('{')[0]} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
