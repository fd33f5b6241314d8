"""`build_app(args)`: the Serve application; `app` is it with the defaults."""

from __future__ import annotations

from ray import serve
from ray.serve import Application

from deployments.config import ServeArgs
from deployments.detok_pool import Detokenizer
from deployments.ingress import Ingress

QUIET_LOGS = {"enable_access_log": False, "log_level": "WARNING"}


def build_app(args: dict[str, str] | None = None) -> Application:
    """``serve run deployments:build_app model=tiny-random max_num_seqs=64`` passes strings; they are validated here."""
    config = ServeArgs(**(args or {}))
    detok = serve.deployment(
        Detokenizer,
        name="Detokenizer",
        autoscaling_config={
            "min_replicas": config.detok_min_replicas,
            "max_replicas": config.detok_max_replicas,
            "target_ongoing_requests": config.detok_target_ongoing_requests,
            "upscale_delay_s": 2.0,
            "downscale_delay_s": 30.0,
        },
        max_ongoing_requests=16,
        ray_actor_options={"num_cpus": 0.5},
        logging_config=QUIET_LOGS,
    ).bind(config.model)
    ingress = serve.deployment(
        Ingress,
        name="Ingress",
        num_replicas=config.ingress_replicas,
        max_ongoing_requests=100_000,
        ray_actor_options={"num_cpus": 0},
        logging_config=QUIET_LOGS,
    )
    return ingress.bind(config.model_dump(), detok)
