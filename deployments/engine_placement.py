"""Where an application's engine actors live: their names (one set per deployment of the
application, keyed by what they are built from), how many and on which resources
(`engine_placement`), creating or finding them (`engine_handles`), and ending those of an
earlier deployment (`kill_engines`). The ingress replicas call `engine_handles`; tests and
benchmarks find an engine by index (`app_engine`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import ray

from deployments.config import ServeArgs
from deployments.engine_actor import EngineActor, EngineHandle

ENGINE_NAMESPACE = "spout"


def engine_key(args: ServeArgs) -> str:
    """A hash of what an application's engines are built from (model, engine configuration, queue,
    placement): engines of another key belong to another deployment of the application."""
    built_from = [asdict(args.engine_config()), args.max_waiting_requests, args.num_engines, args.engine_resource]
    return hashlib.sha256(json.dumps(built_from, sort_keys=True, default=str).encode()).hexdigest()[:12]


def engine_name(app_name: str, args: ServeArgs, index: int) -> str:
    """Engine actor ``index`` of one deployment of a Serve application (in `ENGINE_NAMESPACE`)."""
    return f"{_deployment_prefix(app_name, args)}{index}"


def _deployment_prefix(app_name: str, args: ServeArgs) -> str:
    return f"{_engine_prefix(app_name)}{args.model_name}/{engine_key(args)}/"


def _engine_prefix(app_name: str) -> str:
    return f"spout-engine/{app_name}/"


def app_engines(app_name: str) -> list[str]:
    """The names of a Serve application's engine actors, whichever deployment of it made them."""
    actors = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in actors if a["namespace"] == ENGINE_NAMESPACE and a["name"].startswith(_engine_prefix(app_name)))


def engine_placement(args: ServeArgs, cluster_resources: dict[str, float]) -> tuple[int, dict[str, object]]:
    """How many engine actors, and the Ray options that place each: one per unit of
    ``engine_resource`` when set, else one per GPU (``num_gpus=1``), else one CPU engine."""
    if args.engine_resource is not None:
        units = int(cluster_resources.get(args.engine_resource, 0))
        return args.num_engines or max(units, 1), {"num_cpus": 1, "resources": {args.engine_resource: 1}}
    gpus = int(cluster_resources.get("GPU", 0))
    return args.num_engines or max(gpus, 1), {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_cpus": 1}


def engine_handles(args: ServeArgs, app_name: str) -> list[EngineHandle]:
    """The application's engine actors (`engine_placement`): created by the first replica that
    asks, then found by name. They are detached, so they belong to the application, not to that
    replica: they outlive every ingress replica, and Ray restarts them when they die (on a node
    with their resource, waiting for one to join if none is left). Engines of the application
    that another configuration made (a redeploy that changed it) are ended here; the replica's
    ``__del__`` ends them all when the application is deleted."""
    count, resources = engine_placement(args, ray.cluster_resources())
    actor = ray.remote(max_restarts=-1, max_concurrency=10_000)(EngineActor)
    handles = [
        actor.options(name=engine_name(app_name, args, i), namespace=ENGINE_NAMESPACE, lifetime="detached", get_if_exists=True, **resources).remote(
            args.engine_config(), args.max_waiting_requests
        )
        for i in range(count)
    ]
    kill_engines(app_name, keep_prefix=_deployment_prefix(app_name, args))
    return handles


def app_engine(app_name: str, index: int) -> EngineHandle:
    """Engine actor ``index`` of a Serve application (of its one deployment, once a redeploy has settled)."""
    name = next(name for name in app_engines(app_name) if name.endswith(f"/{index}"))
    return ray.get_actor(name, namespace=ENGINE_NAMESPACE)


def kill_engines(app_name: str, keep_prefix: str | None = None) -> None:
    """End an application's engine actors (Serve does not know them), but those whose names start with ``keep_prefix``."""
    for name in app_engines(app_name):
        if keep_prefix is None or not name.startswith(keep_prefix):
            try:
                ray.kill(ray.get_actor(name, namespace=ENGINE_NAMESPACE), no_restart=True)
            except ValueError:  # another replica ended it first
                pass
