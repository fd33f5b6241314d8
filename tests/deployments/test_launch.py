"""`deployments.launch`'s command line: build_app options as key=value, as ``serve run`` takes them."""

from __future__ import annotations

import pytest

from deployments.config import ServeArgs
from deployments.launch import parse_options


def test_options_are_key_value_pairs_build_app_accepts():
    options = parse_options(["model=tiny-random", "max_num_seqs=64", "served_model_name=a=b"])
    assert options == {"model": "tiny-random", "max_num_seqs": "64", "served_model_name": "a=b"}
    assert ServeArgs(**options).max_num_seqs == 64


@pytest.mark.parametrize("pair", ["model", "=tiny-random"])
def test_a_pair_without_a_key_or_value_is_refused(pair):
    with pytest.raises(SystemExit, match="key=value"):
        parse_options([pair])
