"""A finished beam search as the client sees it: one choice per beam, under an id of its own."""

from __future__ import annotations

from engine.outputs import EngineOutput


def beam_choice_id(request_id: str, index: int) -> str:
    """The id under which beam ``index`` of search ``request_id`` is reported as a choice of its own."""
    return f"{request_id}/beam{index}"


def beam_choice_outputs(output: EngineOutput) -> list[EngineOutput]:
    """A search's final output (``output.beams`` set) as one finished output per beam, under `beam_choice_id`."""
    assert output.beams is not None
    return [
        EngineOutput(
            beam_choice_id(output.request_id, index),
            list(beam.token_ids),
            output.num_prompt_tokens,
            beam.finish_reason,
            beam.stop_reason,
            logprobs=list(beam.logprobs) if beam.logprobs else None,
            error=output.error,
        )
        for index, beam in enumerate(output.beams)
    ]
