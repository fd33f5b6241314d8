"""Summary tables of `bench.serve_load`: baseline ratios, proxy options, addresses, the autoscaling timeline."""

from __future__ import annotations

BASELINE = "baseline"
PROXY_COLUMNS = ("output_tokens_per_s", "cpu_us_per_token", "cpu_us_ingress", "cpu_us_proxy", "cpu_us_detok", "cpu_us_engine")
ADDRESS_COLUMNS = (*PROXY_COLUMNS, "cpu_us_client", "failed_streams", "wrong_streams")


def baseline_ratios(rows: list[dict]) -> list[dict]:
    """Output tokens/s of each other mode over the per-token baseline's, same model, proxy and concurrency."""
    base = {(r["model"], r["proxy"], r["concurrency"]): r["output_tokens_per_s"] for r in rows if r["mode"] == BASELINE}
    return [
        {
            "model": r["model"],
            "proxy": r["proxy"],
            "concurrency": r["concurrency"],
            "mode": r["mode"],
            "tokens_per_s": r["output_tokens_per_s"],
            "baseline_tokens_per_s": b,
            "ratio": round(r["output_tokens_per_s"] / b, 2),
        }
        for r in rows
        if r["mode"] != BASELINE and (b := base.get((r["model"], r["proxy"], r["concurrency"])))
    ]


def proxy_table(rows: list[dict], concurrency: int = 256) -> list[dict]:
    """Per proxy option and mode, at ``concurrency`` streams of tiny-random: tokens/s and CPU µs per token."""
    return [
        {"proxy": r["proxy"], "mode": r["mode"]} | {column: r[column] for column in PROXY_COLUMNS}
        for r in rows
        if r["concurrency"] == concurrency and r["model"] == "tiny-random" and r["mode"] in ("inline", BASELINE)
    ]


def autoscaling_table(autoscaling: dict) -> list[dict]:
    """The detok replica timeline: one row per change of phase or replica count."""
    return [dict(sample) for sample in autoscaling.get("timeline", [])]


def address_table(rows: list[dict], client: str = "httpx") -> list[dict]:
    """The ``client``'s rows: tokens/s and CPU µs per token (net of idle) per proxy option and address, with
    the egress CPU per token over the replica port's at the same mode and concurrency (``vs_replica_port``)."""
    ours = [r for r in rows if r.get("client") == client]
    direct = {(r["mode"], r["concurrency"]): r["cpu_us_per_token"] for r in ours if r["address"] == "replica_port"}
    table = []
    for r in ours:
        base = direct.get((r["mode"], r["concurrency"]))
        ratio = round(r["cpu_us_per_token"] / base, 2) if base else None
        table.append(
            {"proxy": r["proxy"], "address": r["address"], "concurrency": r["concurrency"]} | {c: r[c] for c in ADDRESS_COLUMNS} | {"vs_replica_port": ratio}
        )
    return table
