"""Stop strings and ``max_tokens`` applied to a reasoning model's answer, not to its thinking.

A request with `detok.thinking.AnswerRules` (the serving layer sets them with a reasoning parser) is
detokenized as any other once its answer is under way and far from its limit. Until the answer
begins, its ids are taken one at a time, with the stop strings off, and each id's text is read by
`detok.thinking.scan`: so the id that completes the thinking's ``close`` is known exactly, whatever
the split of the output into calls, and the answer's first characters (after ``close``, or the
whole output when it opens no thinking) are where the stop-string search starts. The stop tail then
holds answer text only, and the ordinary path goes on from there. One inexactness: a stop string found
inside the undecided first characters (a substring of ``open``'s prefix, as ``<`` is) cuts the text
exactly, but the ids kept run to the one that decided the output is an answer.

The answer's token limit: the output ends after ``answer_from + max_tokens`` ids, where
``answer_from`` counts the ids up to the one that completes ``close``. While the output is undecided
(its first characters could still be ``open``), its ids count as answer ids. The end is a
`StopHit` whose ``stop`` is ``None`` (the serving layer finishes the choice with ``length`` and
aborts it in the engine, whose own limit is the answer's plus the thinking's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from detok.api import DetokItem, DetokResult, StopHit
from detok.state import DetokState
from detok.stop import earliest_stop, split_tail, stop_output
from detok.thinking import AnswerProgress, Phase, scan

Detokenize = Callable[[Sequence[DetokItem]], list[DetokResult]]
"""The ordinary batched path (`detok.batch`), which keeps ``state.answer`` as it is."""


def needs_steps(item: DetokItem) -> bool:
    """Whether the item is outside the ordinary path: its answer has not begun, or reaches its limit."""
    state = item.state
    rules, progress = state.params.answer, state.answer
    if rules is None or progress is None or state.done:
        return False
    if progress.phase is not Phase.ANSWER:
        return True
    if rules.max_tokens is None:
        return False
    after = state.num_output_tokens + len(item.new_token_ids)
    limit = progress.answer_from + rules.max_tokens
    return after > limit or (after == limit and not item.finished)


def stepped_result(detokenize: Detokenize, item: DetokItem) -> DetokResult:
    """The result for an item `needs_steps` picked: the same contract as `detok.detokenize_batch`."""
    state, ids = item.state, list(item.new_token_ids)
    rules = state.params.answer
    assert rules is not None and state.answer is not None
    strings = _token_strings(detokenize, item)
    if isinstance(strings, str):
        return DetokResult("", item.state, error=strings)
    text, taken = "", 0
    while state.answer.phase is not Phase.ANSWER and (taken < len(ids) or (item.finished and not state.done)):  # type: ignore[union-attr]
        one = ids[taken : taken + 1]
        finished = item.finished and taken + len(one) == len(ids)
        quiet = state._replace(params=state.params._replace(stop=(), stop_tail_len=0, answer=None), answer=None)
        (step,) = detokenize([DetokItem(quiet, one, finished)])
        if step.error is not None:
            return DetokResult("", item.state, error=step.error)
        taken += len(one)
        read = scan(state.answer, rules.tags, step.text, finished)  # type: ignore[arg-type]
        limit = rules.max_tokens
        cut = read.progress.phase is Phase.UNDECIDED and limit is not None and step.state.num_output_tokens >= limit and not finished
        if cut:  # still undecided, its ids counted as the answer's: the output ends here
            finished, text_so_far = True, step.text
            (step,) = detokenize([DetokItem(step.state, (), True)])
            read = scan(state.answer, rules.tags, text_so_far + step.text, finished)  # type: ignore[arg-type]
        text += read.outside
        state = step.state._replace(params=state.params, answer=read.progress)
        if read.answer is not None:
            answer_from = 0 if read.from_start else state.num_output_tokens
            state = state._replace(answer=AnswerProgress(Phase.ANSWER, "", answer_from))
            sent, state, hit = _answer_begins(state, read.answer, taken, finished)
            text += sent
            if hit is None and cut:
                hit = StopHit(None, taken)
            if hit is not None or state.done:
                return DetokResult(text, state, hit, None, strings)
        if cut:
            return DetokResult(text, state._replace(done=True), StopHit(None, taken), None, strings)
    rest = ids[taken:]
    if state.done or not (rest or item.finished):
        return DetokResult(text, state, None, None, strings)
    return _answer_rest(detokenize, DetokItem(state, rest, item.finished), text, taken, strings)


def _answer_begins(state: DetokState, answer: str, taken: int, finished: bool) -> tuple[str, DetokState, StopHit | None]:
    """The answer's first text (from this call's ``taken``-th id): stop strings looked for in it from its start."""
    params = state.params
    match = earliest_stop(answer, params.stop, 1) if params.stop and state.num_output_tokens > params.min_tokens else None
    if match is not None:
        return stop_output(answer, 0, match, params.include_stop_str_in_output), state._replace(stop_tail="", done=True), StopHit(match.stop, taken)
    assert params.answer is not None and state.answer is not None
    at_limit = params.answer.max_tokens is not None and state.num_output_tokens >= state.answer.answer_from + params.answer.max_tokens
    sent, tail = split_tail(answer, 0, params, finished or at_limit)
    if at_limit and not finished:  # the id that began the answer is its last
        return sent, state._replace(stop_tail="", done=True), StopHit(None, taken)
    return sent, state._replace(stop_tail=tail), None


def _answer_rest(detokenize: Detokenize, item: DetokItem, text: str, taken: int, strings: tuple) -> DetokResult:
    """The item's ids after the answer began (``taken`` before them in the call), on the ordinary path,
    cut at the answer's limit."""
    state, rest = item.state, list(item.new_token_ids)
    assert state.params.answer is not None and state.answer is not None
    limit = None if state.params.answer.max_tokens is None else state.answer.answer_from + state.params.answer.max_tokens
    after = state.num_output_tokens + len(rest)
    cut = limit is not None and (after > limit or (after == limit and not item.finished))
    if cut:
        assert limit is not None
        rest = rest[: limit - state.num_output_tokens]
    (result,) = detokenize([DetokItem(state, rest, item.finished or cut)])
    if result.error is not None:
        return result
    hit = result.stop
    if hit is not None:
        hit = StopHit(hit.stop, taken + hit.keep_tokens)
    elif cut:
        hit = StopHit(None, taken + len(rest))
    return DetokResult(text + result.text, result.state, hit, None, strings)


def _token_strings(detokenize: Detokenize, item: DetokItem) -> tuple | str:
    """The logprob token strings the item asks for (an error message if its ids are bad)."""
    if not item.logprob_token_ids:
        return ()
    quiet = item.state._replace(params=item.state.params._replace(stop=(), stop_tail_len=0, answer=None), answer=None)
    (result,) = detokenize([DetokItem(quiet, (), False, item.logprob_token_ids)])
    return result.error if result.error is not None else result.token_strings
