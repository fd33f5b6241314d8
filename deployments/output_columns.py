"""A step's `EngineOutput`s as columns on the wire: what `Polled` pickles to, one message per step.

Pickled as objects, an output costs its receiver about 9 µs to rebuild (a dataclass of eleven
fields, each named in the pickle) and its sender about 5; a step of plain outputs (new ids, no
logprobs, no error, no beams, no drafts) goes as four lists instead, a list per field, and the
receiver builds each output from its three to five values (about 2.5 µs in all). Outputs with
more travel whole, with their places in the step.
"""

from __future__ import annotations

from engine.outputs import EngineOutput, FinishReason

Ends = list[tuple[int, FinishReason | None, int | None]]
"""(index among the plain outputs, finish reason, stop reason) of those that carry an end."""
Columns = tuple[list[str], list[list[int]], list[int], Ends, list[tuple[int, EngineOutput]]]


def is_plain(output: EngineOutput) -> bool:
    return (
        output.logprobs is None
        and output.prompt_logprobs is None
        and output.error is None
        and output.beams is None
        and output.num_draft_tokens == 0
        and output.num_accepted_tokens == 0
    )


def to_columns(outputs: list[EngineOutput]) -> Columns:
    """The plain outputs' fields as columns (the ends of the finished ones in pairs), the others whole with their index."""
    ids: list[str] = []
    tokens: list[list[int]] = []
    prompts: list[int] = []
    ends: Ends = []
    whole: list[tuple[int, EngineOutput]] = []
    for index, output in enumerate(outputs):
        if not is_plain(output):
            whole.append((index, output))
            continue
        ids.append(output.request_id)
        tokens.append(output.new_token_ids)
        prompts.append(output.num_prompt_tokens)
        if output.finish_reason is not None or output.stop_reason is not None:
            ends.append((len(ids) - 1, output.finish_reason, output.stop_reason))
    return ids, tokens, prompts, ends, whole


def from_columns(ids: list[str], tokens: list[list[int]], prompts: list[int], ends: Ends, whole: list[tuple[int, EngineOutput]]) -> list[EngineOutput]:
    """The outputs `to_columns` took, in their order."""
    outputs = [EngineOutput(request_id, new_ids, num_prompt) for request_id, new_ids, num_prompt in zip(ids, tokens, prompts)]
    for index, finish_reason, stop_reason in ends:
        outputs[index].finish_reason, outputs[index].stop_reason = finish_reason, stop_reason
    for index, output in whole:
        outputs.insert(index, output)
    return outputs
