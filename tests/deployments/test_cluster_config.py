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


RAY_TOKEN = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.spout/ray_token "


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_every_node_runs_ray_with_token_authentication(name: str) -> None:
    config = load(name)
    commands = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key] if "ray start" in c or "serve deploy" in c]
    assert len(commands) == 3
    assert all(RAY_TOKEN in command for command in commands), commands
    assert config["file_mounts"]["/home/ubuntu/.spout/ray_token"] == "~/.spout/ray_token"


def test_the_serve_config_says_how_to_deploy_it_with_the_token() -> None:
    assert "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.spout/ray_token serve deploy" in (ROOT / "serve_config.yaml").read_text()
