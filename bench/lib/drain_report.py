"""What `bench.drain` judges and reports, without Ray: each stream's verdict against its prompt's
reference, the scale-downs it forced, and the rows per deployment.

A stream is **cut** when it failed (an error frame, a transport error, a status other than 200), had
no ``data: [DONE]``, or fewer completion tokens than it asked for; **wrong** when it completed but its
text differs from its prompt's greedy reference. A scale-down counts only when the deployment
really went from two running replicas to one: a replica was seen ``STOPPING``, none was started
(a replacement would be a redeploy, not a scale-down), and the count reached one within the wait.
A stream is reported under a deployment when it was live while one of that deployment's replicas
drained (from the scale-down's request until the count was one); the ``all`` row counts every stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bench.lib.load_client import StreamResult

ALL = "all"


class Verdict(Enum):
    COMPLETED = "completed"
    CUT = "cut"
    WRONG = "wrong"


@dataclass(frozen=True)
class StreamRecord:
    """One closed-loop request: which prompt, when it began and ended (seconds since the benchmark began), and what came."""

    prompt: int
    started_s: float
    ended_s: float
    result: StreamResult


@dataclass(frozen=True)
class ScaleDown:
    """One forced scale-down of ``deployment`` from two replicas to one, as ``serve.status()`` showed it."""

    deployment: str
    requested_s: float
    """When the lighter replica count was deployed (seconds since the benchmark began)."""
    before: dict[str, int]
    """The deployment's replicas by state when it was asked."""
    stopping_seen: bool
    starting_seen: bool
    drain_s: float | None
    """From the request until one running replica and no other; None when the wait timed out."""
    streams_live: int
    """Streams in flight when a replica was first seen stopping."""

    @property
    def counted(self) -> bool:
        return self.before == {"RUNNING": 2} and self.stopping_seen and not self.starting_seen and self.drain_s is not None

    @property
    def ended_s(self) -> float:
        return self.requested_s + (self.drain_s or 0.0)


def verdict(result: StreamResult, reference: str, max_tokens: int) -> Verdict:
    if cut_reason(result, max_tokens):
        return Verdict.CUT
    return Verdict.COMPLETED if result.text == reference else Verdict.WRONG


def cut_reason(result: StreamResult, max_tokens: int) -> str:
    """Why the stream counts as cut ("" when it was not): the first of its error, a missing ``[DONE]``, too few tokens."""
    if result.failed or result.error:
        return result.error or "failed"
    if not result.done:
        return "no [DONE]"
    if result.tokens < max_tokens:
        return f"{result.tokens} of {max_tokens} tokens"
    return ""


def draining_deployment(record: StreamRecord, scale_downs: Sequence[ScaleDown]) -> str | None:
    """The deployment of the first scale-down whose drain the stream was live during, if any."""
    for scale_down in scale_downs:
        if record.started_s < scale_down.ended_s and record.ended_s > scale_down.requested_s:
            return scale_down.deployment
    return None


def drain_rows(scale_downs: Sequence[ScaleDown], records: Sequence[StreamRecord], references: Sequence[str], max_tokens: int) -> list[dict[str, object]]:
    """A row per deployment scaled down (in the order first scaled), then the ``all`` row."""
    deployments = list(dict.fromkeys(s.deployment for s in scale_downs))
    verdicts = {name: dict.fromkeys(Verdict, 0) for name in [*deployments, ALL]}
    for record in records:
        judged = verdict(record.result, references[record.prompt], max_tokens)
        verdicts[ALL][judged] += 1
        if (name := draining_deployment(record, scale_downs)) is not None:
            verdicts[name][judged] += 1
    rows = []
    for name in [*deployments, ALL]:
        mine = [s for s in scale_downs if name in (s.deployment, ALL)]
        drains = [s.drain_s for s in mine if s.drain_s is not None]
        rows.append(
            {
                "deployment": name,
                "scale_downs": sum(s.counted for s in mine),
                "streams_completed": verdicts[name][Verdict.COMPLETED],
                "streams_cut": verdicts[name][Verdict.CUT],
                "streams_wrong": verdicts[name][Verdict.WRONG],
                "max_drain_s": max(drains, default=None),
            }
        )
    return rows


def failed_streams(records: Sequence[StreamRecord], references: Sequence[str], max_tokens: int, limit: int = 50) -> list[dict[str, object]]:
    """The first ``limit`` cut or wrong streams, with why and when: the evidence to look for in the logs."""
    found = []
    for record in records:
        judged = verdict(record.result, references[record.prompt], max_tokens)
        if judged is not Verdict.COMPLETED:
            reason = cut_reason(record.result, max_tokens) or "text differs from the reference"
            found.append(
                {
                    "verdict": judged.value,
                    "reason": reason,
                    "prompt": record.prompt,
                    "tokens": record.result.tokens,
                    "started_s": round(record.started_s, 1),
                    "ended_s": round(record.ended_s, 1),
                }
            )
    return found[:limit]
