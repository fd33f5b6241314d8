"""What the ingress's metrics cost a token and a request, in-process.

``python -m bench.metrics_cost [--number 200000] [--repeats 5]`` times each call
`deployments.engine_client.EngineClient` makes on `deployments.metrics.IngressMetrics`:
per streamed delta (``itl``: the only one on a token's path), per finished choice
(``request_success``) and per request (``ttft``, ``e2e``, the token and HTTP counters), with
``model_name`` and ``replica`` bound when the replica starts. For comparison it times
``prometheus_client``'s ``Histogram`` with the two labels looked up per observation, the
alternative to binding them once. Prints a table and writes bench/results/metrics_cost.json
with rows {call, per, ns_per_call} (best of the repeats) and the machine's quietness.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from bench.lib.common import print_table, quietness, write_results
from deployments.metrics import LATENCY_BUCKETS_S, IngressMetrics


def calls(metrics: IngressMetrics) -> list[tuple[str, str, Callable[[], object]]]:
    """(call, how often the ingress makes it, the call) for each metric call of a request's path."""
    unbound = Histogram("itl_seconds", "help", ["model_name", "replica"], buckets=LATENCY_BUCKETS_S, registry=CollectorRegistry())
    return [
        ("(an empty call: the timing's floor)", "-", lambda: None),
        ("itl.observe", "delta", lambda: metrics.itl.observe(0.0123)),
        ("request_success.inc", "choice", lambda: metrics.request_success.inc("length")),
        ("ttft.observe", "request", lambda: metrics.ttft.observe(0.0456)),
        ("e2e.observe", "request", lambda: metrics.e2e.observe(1.5)),
        ("prompt_tokens.inc", "request", lambda: metrics.prompt_tokens.inc(120)),
        ("generation_tokens.inc", "request", lambda: metrics.generation_tokens.inc(64)),
        ("requests.inc", "request", lambda: metrics.requests.inc("200")),
        ("Histogram.labels(model, replica).observe", "(not used)", lambda: unbound.labels("tiny-random", "replica").observe(0.0123)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    metrics = IngressMetrics("tiny-random", "bench-replica")
    rows = []
    for name, per, call in calls(metrics):
        best = min(timeit.repeat(call, number=args.number, repeat=args.repeats)) / args.number
        rows.append({"call": name, "per": per, "ns_per_call": round(best * 1e9)})
    print_table(rows)
    print(write_results("metrics_cost", rows, **quietness(load)))


if __name__ == "__main__":
    main()
