"""The cluster launcher configs pass Ray's own validation, and deploy the checked Serve config."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from deployments.config import ServeArgs

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FILES = ["cluster.yaml", "cluster-local.yaml"]
SHARED_KEYS = ["file_mounts", "setup_commands", "head_start_ray_commands", "worker_start_ray_commands"]


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_ray_validates_the_cluster_config(name: str) -> None:
    validate_config(prepare_config(load(name)))  # what `ray up` runs first; raises on a bad config


def test_ray_validation_would_catch_a_mistake() -> None:
    config = load("cluster.yaml")
    config["available_node_types"]["gpu_worker"]["resourcez"] = {"GPU": 1}
    with pytest.raises(Exception, match="resourcez"):
        validate_config(prepare_config(copy.deepcopy(config)))


def test_local_variant_runs_the_same_commands() -> None:
    cloud, local = load("cluster.yaml"), load("cluster-local.yaml")
    assert local["provider"]["type"] == "local" and local["provider"]["head_ip"] and local["provider"]["worker_ips"]
    assert {key: local[key] for key in SHARED_KEYS} == {key: cloud[key] for key in SHARED_KEYS}


def test_the_head_deploys_a_valid_serve_config() -> None:
    deploy = next(command for command in load("cluster.yaml")["head_start_ray_commands"] if "serve deploy" in command)
    path = deploy.split("serve deploy", 1)[1].split()[0]
    config = ServeDeploySchema(**load(path))
    (application,) = config.applications
    ServeArgs(**application.args)
