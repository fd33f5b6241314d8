"""Which sampling fields go with beam search, checked before a request is queued (by the engine and the ingress)."""

from __future__ import annotations

from sampling.params import SamplingParams

SAMPLING_FIELDS_REFUSED: dict[str, object] = {
    "top_p": 1.0,
    "top_k": (0, -1),
    "min_p": 0.0,
    "typical_p": 1.0,
    "xtc_probability": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "dry_multiplier": 0.0,
    "logit_bias": {},
    "bad_words": [],
    "min_tokens": 0,
    "guidance_scale": 1.0,
    "negative_prompt": None,
    "prompt_logprobs": None,
    "structured_outputs": None,
}
"""Fields beam search cannot honour, with the values that leave them off (a tuple: any of them).
Beams are scored by the model's log-probabilities: nothing is drawn, so truncations mean nothing, and
penalties and masks would need a state per beam. ``temperature`` and ``seed`` are ignored."""


class BeamSearchParamError(ValueError):
    """A request's beam-search fields conflict; ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def check_beam_params(params: SamplingParams) -> None:
    """Raise `BeamSearchParamError` naming the first field that does not go with (or without) beam search."""
    if not params.use_beam_search:
        if params.length_penalty != 1.0:
            raise BeamSearchParamError("length_penalty", "applies only to beam search (use_beam_search)")
        if params.early_stopping is not False:
            raise BeamSearchParamError("early_stopping", "applies only to beam search (use_beam_search)")
        return
    for name, off in SAMPLING_FIELDS_REFUSED.items():
        value = getattr(params, name)
        if value not in (off if isinstance(off, tuple) else (off,)):
            raise BeamSearchParamError(name, f"cannot be combined with beam search (use_beam_search); leave it at {off!r}")
    if params.top_n_sigma > 0:
        raise BeamSearchParamError("top_n_sigma", "cannot be combined with beam search (use_beam_search)")
    if params.num_speculative_tokens:
        raise BeamSearchParamError("num_speculative_tokens", "cannot be combined with beam search (use_beam_search)")
