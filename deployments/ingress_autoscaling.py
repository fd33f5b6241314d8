"""The ingress's autoscaling when its replicas serve HTTP themselves (``http_front=replica``).

Serve's own policy counts the requests that reach a replica through Serve (its proxies, HAProxy's
direct ingress, handles); a replica front's requests come through the replica's own server, which
Serve never sees. So each replica reports the requests its server has in flight
(`Ingress.record_autoscaling_stats`, averaged by Serve over ``look_back_period_s``) and this policy
asks for one replica per ``target_ongoing_requests`` of their sum, as Serve's policy does with its
own count. Serve then applies the min / max bounds and the upscale / downscale delays.
"""

from __future__ import annotations

import math

from ray.serve.config import AutoscalingContext

REQUESTS_METRIC = "http_requests_in_flight"
"""Custom autoscaling metric: requests a replica's own HTTP server is answering or holds queued."""


def requests_autoscaling_policy(ctx: AutoscalingContext) -> tuple[int, dict]:
    """One replica per ``target_ongoing_requests`` requests in flight across the replicas; the count
    that runs while no replica has reported yet (one just started)."""
    per_replica = (ctx.aggregated_metrics or {}).get(REQUESTS_METRIC, {})
    if not per_replica:
        return ctx.current_num_replicas, {}
    return math.ceil(sum(per_replica.values()) / ctx.config.target_ongoing_requests), {}
