"""`build_app(args)`: the Serve application; `app` is it with the defaults.

Under ``serve run deployments:app`` it turns Serve's fast path on before the CLI starts Ray
(`fast_path.enable_for_serve_run`); wherever it runs in a cluster without the fast path, it says so.
"""

from __future__ import annotations

import logging
import os

from ray import serve
from ray.serve import Application

from deployments.config import ServeArgs
from deployments.detok_pool import Detokenizer, fanout_autoscaling_policy
from deployments.fast_path import enable_for_serve_run, fast_path_warning
from deployments.ingress import Ingress
from deployments.ingress_autoscaling import requests_autoscaling_policy

QUIET_LOGS = {"enable_access_log": False, "log_level": "WARNING"}
DETOK_RESOURCE_UNITS = 0.01
"""Of ``detok_resource`` per detokenizer replica: a node offering one unit hosts up to 100."""
logger = logging.getLogger(__name__)


def build_app(args: dict[str, str] | None = None) -> Application:
    """``serve run deployments:build_app model=tiny-random max_num_seqs=64`` passes strings; they are validated here,
    and the API key comes from ``SPOUT_API_KEY`` unless ``api_key`` is given."""
    config = ServeArgs.from_options(args or {}, os.environ)
    enable_for_serve_run()
    if config.http_front == "serve" and (warning := fast_path_warning(os.environ)):
        logger.warning(warning)
    detok = serve.deployment(
        Detokenizer,
        name="Detokenizer",
        autoscaling_config={
            "min_replicas": config.detok_min_replicas,
            "max_replicas": config.detok_max_replicas,
            "policy": {"policy_function": fanout_autoscaling_policy},
            # The widest step of the last few seconds, reported by each replica twice a second.
            "aggregation_function": "max",
            "look_back_period_s": 5.0,
            "metrics_interval_s": 0.5,
            "upscale_delay_s": config.detok_upscale_delay_s,
            "downscale_delay_s": config.detok_downscale_delay_s,
        },
        max_ongoing_requests=16,
        graceful_shutdown_timeout_s=config.replica_drain_timeout_s,
        ray_actor_options={"num_cpus": 0.5} | ({"resources": {config.detok_resource: DETOK_RESOURCE_UNITS}} if config.detok_resource else {}),
        logging_config=QUIET_LOGS,
    ).bind(config.model)
    ingress = serve.deployment(
        Ingress,
        name="Ingress",
        **ingress_replicas(config),
        max_ongoing_requests=100_000,
        graceful_shutdown_timeout_s=config.replica_drain_timeout_s,
        ray_actor_options={"num_cpus": 0} | ({"resources": {config.ingress_resource: 1}} if config.ingress_resource else {}),
        logging_config=QUIET_LOGS,
    )
    return ingress.bind(config.model_dump(), detok)


def ingress_replicas(config: ServeArgs) -> dict[str, object]:
    """A fixed count when the bounds are equal (Serve's autoscaler then has nothing to decide),
    else Serve's autoscaling on requests in flight per replica: as Serve counts them, or, where the
    replicas serve HTTP themselves, as their own servers do (`deployments.ingress_autoscaling`)."""
    if config.ingress_min_replicas == config.ingress_max_replicas:
        return {"num_replicas": config.ingress_min_replicas}
    autoscaling = {
        "min_replicas": config.ingress_min_replicas,
        "max_replicas": config.ingress_max_replicas,
        "target_ongoing_requests": config.ingress_target_streams,
        "upscale_delay_s": config.ingress_upscale_delay_s,
        "downscale_delay_s": config.ingress_downscale_delay_s,
    }
    if config.http_front == "replica":
        autoscaling["policy"] = {"policy_function": requests_autoscaling_policy}
    return {"autoscaling_config": autoscaling}
