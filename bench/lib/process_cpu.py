"""CPU seconds of each kind of process of this benchmark's own Ray cluster, read from /proc.

Only descendants of this process count (other sessions on the machine may run Ray
clusters with the same process titles). A kind sums all its processes, e.g. every
detok replica; "client" is this process, the load generator. vLLM's API server (started by
`bench.egress_peers`) is ``vllm_api`` and its engine core process ``vllm_engine``.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")

REPLICA_TITLE = "ray::ServeReplica:"
"""Followed by ``app:deployment``."""
DEPLOYMENT_KINDS = {"Ingress": "ingress", "BaselineIngress": "ingress", "Detokenizer": "detok", "EngineServer": "engine"}
PROCESS_KINDS: dict[str, tuple[str, ...]] = {
    "engine": ("ray::EngineActor", "ray::SyntheticEngineActor"),
    "proxy": ("ray::ProxyActor", "ray::HAProxyManager", "haproxy"),
    "controller": ("ray::ServeController",),
    "ray_system": ("gcs_server", "raylet"),
}
VLLM_API_MODULE = b"vllm.entrypoints.openai.api_server"
VLLM_TITLE = "VLLM::"
"""The prefix vLLM's engine core and workers set as their process title."""
KINDS = ("ingress", "detok", "engine", "proxy", "controller", "ray_system", "client")
EGRESS_KINDS = ("ingress", "detok", "proxy")
"""The processes between the engine's outputs and the client's socket."""


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds user + system) of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def _kind(pid: str) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    title = argv[0].decode(errors="replace")
    if VLLM_API_MODULE in argv[1:4]:
        return "vllm_api"
    if title.startswith(VLLM_TITLE):
        return "vllm_engine"
    if title.startswith(REPLICA_TITLE):
        return DEPLOYMENT_KINDS.get(title.rsplit(":", 1)[1].strip())
    name = os.path.basename(title)
    for kind, markers in PROCESS_KINDS.items():
        if any(title.startswith(m) if m.startswith("ray::") else name == m for m in markers):
            return kind
    return None


def cpu_seconds() -> dict[str, tuple[str, float]]:
    """pid -> (kind, CPU seconds so far) of this process (kind "client") and of its descendants that have a kind."""
    stats = {pid: s for pid in filter(str.isdigit, os.listdir("/proc")) if (s := _stat(pid)) is not None}
    me = str(os.getpid())
    ours = {me}
    grew = True
    while grew:  # descendants: children of anything already ours
        new = {pid for pid, (ppid, _) in stats.items() if str(ppid) in ours and pid not in ours}
        ours |= new
        grew = bool(new)
    kinds = {pid: _kind(pid) for pid in ours - {me}} | {me: "client"}
    return {pid: (kind, stats[pid][1]) for pid, kind in kinds.items() if kind is not None}


def cpu_used(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds of each kind between two `cpu_seconds` readings. A process that started in
    between counts from zero; one that ended in between is left out (its last reading is lost)."""
    used = dict.fromkeys(KINDS, 0.0)
    for pid, (kind, seconds) in after.items():
        used[kind] = used.get(kind, 0.0) + (seconds - before[pid][1] if pid in before else seconds)
    return used


def per_token_us(
    before: dict[str, tuple[str, float]],
    after: dict[str, tuple[str, float]],
    tokens: int,
    idle_cores: dict[str, float] | None = None,
    elapsed_s: float = 0.0,
) -> dict[str, float]:
    """µs of CPU per output token of each kind between two readings; "egress" sums `EGRESS_KINDS`.

    With ``idle_cores`` (cores each kind uses with no request in flight), what the kind would
    have used idle over ``elapsed_s`` is subtracted first (never below zero)."""
    idle = idle_cores or {}
    used = {kind: max(seconds - idle.get(kind, 0.0) * elapsed_s, 0.0) for kind, seconds in cpu_used(before, after).items()}
    us = {kind: seconds / max(tokens, 1) * 1e6 for kind, seconds in used.items()}
    us["egress"] = sum(us[kind] for kind in EGRESS_KINDS)
    return {kind: round(value, 1) for kind, value in us.items()}
