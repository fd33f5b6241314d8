"""Engine actor names: one application's deployment with one engine configuration per name (issue 23)."""

from __future__ import annotations

from deployments.config import ServeArgs
from deployments.engine_placement import engine_name


def name(**options: str) -> str:
    return engine_name("spout", ServeArgs.from_options({"model": "tiny-random", **options}, {}), 0)


def test_the_same_options_give_the_same_name():
    assert name(max_num_seqs="8") == name(max_num_seqs="8")


def test_another_engine_option_queue_or_placement_gives_another_name():
    names = {name(), name(max_num_seqs="4"), name(max_model_len="128"), name(max_waiting_requests="512"), name(num_engines="2")}
    assert len(names) == 5


def test_an_option_of_the_ingress_alone_keeps_the_engines():
    assert name(ingress_min_replicas="2", ingress_max_replicas="3", max_stop_strings="4") == name()


def test_names_carry_the_app_and_the_model():
    assert name().startswith("spout-engine/spout/tiny-random/")
