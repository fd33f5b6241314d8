"""Serve settings that lower the CPU an idle app costs, for the ways of starting it that start Ray
(``make run``, ``serve run``, the benchmarks' clusters).

Serve's defaults (Ray 2.60, ``ray/serve/_private/constants.py``) wake its controller ten times a second
and export every replica's and proxy's cached request metrics ten times a second. Measured on a
2-core machine with ``make run``'s app idle (CPU from /proc over 20 s; docs/benchmarks.md): Serve's
controller 3.05% of a core on the defaults, 1.1% with these. What they cost:

- ``RAY_SERVE_CONTROL_LOOP_INTERVAL_S`` 0.1 -> 0.5: the controller's reconcile loop (deploys, health
  checks, autoscaling decisions, HAProxy's target broadcasts) reacts up to 0.4 s later; the detok
  pool's autoscaling delays (seconds) are unchanged.
- ``RAY_SERVE_METRICS_EXPORT_INTERVAL_MS`` 100 -> 1000: Serve's own request metrics (``serve_*`` on
  Ray's metrics port) are exported once a second; Prometheus scrapes every 10-15 s. Spout's metrics
  (`deployments.metrics`) are not cached and not affected.
- ``RAY_SERVE_HAPROXY_NBTHREAD`` 4 -> the node's cores, at most 4: HAProxy's threads beyond the cores
  only contend for them.

Like `deployments.fast_path`'s switches these are read by Ray's processes when they start, so they
go on the command that starts Ray; an operator's own value wins. No Ray here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

HAPROXY_THREADS_ENV = "RAY_SERVE_HAPROXY_NBTHREAD"
SERVE_HAPROXY_THREADS = 4
"""Serve's default HAProxy thread count."""
IDLE_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}
"""Settings that do not depend on the machine; `idle_env` adds HAProxy's threads."""


def idle_env(environ: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """`IDLE_ENV` and HAProxy's thread count for a machine of ``cores`` (default: this one's),
    less what ``environ`` (the operator's) already sets."""
    threads = min(SERVE_HAPROXY_THREADS, cores or os.cpu_count() or 1)
    settings = IDLE_ENV | {HAPROXY_THREADS_ENV: str(threads)}
    return {name: value for name, value in settings.items() if name not in environ}
