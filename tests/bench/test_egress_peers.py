"""`bench.egress_peers` builds its rows from what the client saw and the CPU /proc gave, without
starting a server: the front's µs per token, the per-kind split, the ratios, the text check."""

from __future__ import annotations

from bench.egress_peers import SPOUT, VLLM, front_ratios, level_row, print_rows, rounds
from bench.lib.load_client import StreamResult


def streams(texts: list[str], tokens: int) -> list[StreamResult]:
    return [StreamResult(text=text, tokens=tokens, frames=tokens, ttft_s=0.01, gaps_s=[0.001] * (tokens - 1)) for text in texts]


def test_rounds_reach_the_level_tokens():
    assert rounds(16, 16384) == 16
    assert rounds(256, 16384) == 1
    assert rounds(64, 1000) == 1


def test_rows_split_cpu_per_token_and_compare_with_vllm():
    spout_used = {"ingress": 0.05, "detok": 0.0, "proxy": 0.02, "controller": 0.01, "engine": 0.2, "ray_system": 0.01, "client": 0.5}
    spout = level_row(SPOUT, (2, streams(["a", "b", "a", "x"], 250), 0.5, spout_used, 0.7), ["a", "b"])
    assert spout["cpu_us_per_token_front"] == 80.0  # (0.05 + 0.02 + 0.01) s / 1,000 tokens; the engine and client apart
    assert (spout["cpu_us_ingress"], spout["cpu_us_proxy"], spout["cpu_us_engine"]) == (50.0, 20.0, 200.0)
    assert "cpu_us_client" not in spout
    assert spout["output_tokens_per_s"] == 2000.0
    assert spout["differs_from_vllm"] == 1  # the second round's second stream
    assert spout["streams"] == 4 and spout["load_average_before"] == 0.7

    vllm_used = {"vllm_api": 0.16, "vllm_engine": 0.3, "client": 0.5, "ingress": 0.0}
    vllm = level_row(VLLM, (2, streams(["a", "b", "a", "b"], 250), 1.0, vllm_used, 0.9), [None, None])
    assert vllm["cpu_us_per_token_front"] == 160.0 and vllm["cpu_us_vllm_engine"] == 300.0
    assert "cpu_us_ingress" not in vllm and vllm["differs_from_vllm"] is None

    ratios = front_ratios([spout, vllm])
    assert ratios == [{"concurrency": 2, "front_cpu_spout_over_vllm": 0.5, "tokens_per_s_spout_over_vllm": 2.0}]
    print_rows([spout, vllm], ratios)  # a table per server: their columns differ
