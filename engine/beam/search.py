"""Beam search as vLLM runs it, one round at a time; pure Python over token ids and logprobs.

Each round takes, from the live beams' next-token distributions, the ``2 * width``
continuations with the highest cumulative logprob. Those that end (EOS unless ``ignore_eos``,
a stop token id, ``max_tokens`` or the context length) join the finished hypotheses, of which
the ``width`` best by score are kept; the ``width`` best that go on are the next round's
beams. A hypothesis's score is ``cumulative_logprob / length ** length_penalty``, its length
counting the prompt and not an EOS that ended it (vLLM's). ``early_stopping`` decides when the search
ends once ``width`` hypotheses have finished: True at once; False when the best live beam's
score is no better than the worst kept hypothesis's; ``"never"`` when no continuation of it can
be, its length bounded by ``max_tokens`` and the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

from engine.outputs import FinishReason, Hypothesis, TokenLogprobs
from sampling.params import SamplingParams


class Candidates(NamedTuple):
    """The most probable next tokens of one beam, most probable first (masked tokens at -inf)."""

    token_ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class BeamSpec:
    """What one search needs to know, from the request and the engine."""

    width: int
    length_penalty: float
    early_stopping: bool | Literal["never"]
    max_tokens: int | None
    num_prompt_tokens: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    num_logprobs: int | None

    @classmethod
    def of(cls, params: SamplingParams, num_prompt_tokens: int, max_model_len: int, eos_token_ids: tuple[int, ...]) -> BeamSpec:
        return cls(
            width=params.n,
            length_penalty=params.length_penalty,
            early_stopping=params.early_stopping,
            max_tokens=params.max_tokens,
            num_prompt_tokens=num_prompt_tokens,
            max_model_len=max_model_len,
            eos_token_ids=frozenset(eos_token_ids),
            stop_token_ids=frozenset(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            num_logprobs=params.logprobs,
        )

    @property
    def num_candidates(self) -> int:
        """Next tokens needed per beam: ``2 * width``, or the logprobs asked for if more."""
        return max(2 * self.width, self.num_logprobs or 0)

    @property
    def longest(self) -> int:
        """The most positions (prompt and output) a hypothesis can reach."""
        room = self.max_model_len if self.max_tokens is None else min(self.max_model_len, self.num_prompt_tokens + self.max_tokens)
        return room


def score(spec: BeamSpec, hypothesis: Hypothesis, length: int | None = None) -> float:
    """``cumulative_logprob / length ** length_penalty``; length: prompt and output, not counting an EOS that ended it."""
    if length is None:
        tokens = hypothesis.token_ids
        ended_by_eos = not spec.ignore_eos and tokens and tokens[-1] in spec.eos_token_ids
        length = spec.num_prompt_tokens + len(tokens) - (1 if ended_by_eos else 0)
    return hypothesis.cumulative_logprob / max(length, 1) ** spec.length_penalty


class Round(NamedTuple):
    """A round's outcome: the next beams (each with the index of the beam it continues), the kept
    finished hypotheses (best first), and whether the search is over."""

    beams: list[tuple[int, Hypothesis]]
    finished: list[Hypothesis]
    done: bool


def advance(spec: BeamSpec, beams: list[Hypothesis], candidates: list[Candidates], finished: list[Hypothesis]) -> Round:
    """One round: ``candidates[i]`` is the next-token distribution of ``beams[i]``."""
    children = _best_children(spec, beams, candidates)
    new_finished = [child for child in children if child[1].finish_reason is not None]
    running = [child for child in children if child[1].finish_reason is None]  # one length: by score as by logprob
    kept = sorted([*finished, *(hypothesis for _, hypothesis in new_finished)], key=lambda h: score(spec, h), reverse=True)[: spec.width]
    if not running:
        return Round([], kept, done=True)
    if len(kept) >= spec.width and _no_better_to_come(spec, running[0][1], kept[-1]):
        return Round([], kept, done=True)
    return Round(running[: spec.width], kept, done=False)


def best(spec: BeamSpec, finished: list[Hypothesis]) -> list[Hypothesis]:
    """The ``width`` best finished hypotheses, best first; when fewer continuations exist (a few
    ``allowed_token_ids``, a short ``max_tokens``), empty ones at -inf fill the rest."""
    kept = sorted(finished, key=lambda h: score(spec, h), reverse=True)[: spec.width]
    return kept + [Hypothesis((), -math.inf, (), FinishReason.STOP)] * (spec.width - len(kept))


def _best_children(spec: BeamSpec, beams: list[Hypothesis], candidates: list[Candidates]) -> list[tuple[int, Hypothesis]]:
    """The ``2 * width`` continuations with the highest cumulative logprob (ties: earlier beam, likelier token)."""
    scored = []
    for index, (beam, options) in enumerate(zip(beams, candidates)):
        for token_id, logprob in zip(options.token_ids[: spec.num_candidates], options.logprobs[: spec.num_candidates]):
            if logprob == -math.inf:
                break
            scored.append((beam.cumulative_logprob + logprob, index, token_id, logprob))
    scored.sort(key=lambda entry: -entry[0])
    return [(index, _child(spec, beams[index], candidates[index], token_id, logprob)) for _, index, token_id, logprob in scored[: 2 * spec.width]]


def _child(spec: BeamSpec, parent: Hypothesis, options: Candidates, token_id: int, logprob: float) -> Hypothesis:
    token_ids = (*parent.token_ids, token_id)
    entries = parent.logprobs
    if spec.num_logprobs is not None:
        rank = 1 + sum(other > logprob for other in options.logprobs)
        top = spec.num_logprobs
        entries = (*entries, TokenLogprobs(logprob, rank, options.token_ids[:top], options.logprobs[:top]))
    reason, stop_reason = _finish(spec, token_ids)
    return Hypothesis(token_ids, parent.cumulative_logprob + logprob, entries, reason, stop_reason)


def _finish(spec: BeamSpec, token_ids: tuple[int, ...]) -> tuple[FinishReason | None, int | None]:
    """Why a beam ending in these tokens is over (as `engine.request.check_stop`), or (None, None)."""
    last = token_ids[-1]
    if not spec.ignore_eos and last in spec.eos_token_ids:
        return FinishReason.STOP, None
    if last in spec.stop_token_ids:
        return FinishReason.STOP, last
    if spec.max_tokens is not None and len(token_ids) >= spec.max_tokens:
        return FinishReason.LENGTH, None
    if spec.num_prompt_tokens + len(token_ids) >= spec.max_model_len:
        return FinishReason.LENGTH, None
    return None, None


def _no_better_to_come(spec: BeamSpec, best_live: Hypothesis, worst_kept: Hypothesis) -> bool:
    """`early_stopping`'s test, once ``width`` hypotheses have finished."""
    if spec.early_stopping is True:
        return True
    if spec.early_stopping == "never" and spec.length_penalty > 0:
        attainable = score(spec, best_live, length=spec.longest)  # logprobs only fall: the longest scores best
    else:
        attainable = score(spec, best_live)
    return score(spec, worst_kept) >= attainable
