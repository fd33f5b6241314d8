"""`Feature`: the sampler's stages a request may need, decided on the host once when it joins.

`SamplingBatch.uses` counts, per feature, the occupied rows that need it, so the sampler picks the
stages of a step without reading device tensors; `TRUNCATIONS` are the features that truncate the
distribution a row draws from (`sampling.ops.truncation`, the Triton kernels).
"""

from __future__ import annotations

from enum import Enum

from sampling.params import SamplingParams
from sampling.tokenized import uses_dry


class Feature(Enum):
    PENALTIES = "penalties"
    """Repetition, presence or frequency penalty."""
    DRY = "dry"
    ALLOWED = "allowed"
    """``allowed_token_ids``."""
    LOGPROBS = "logprobs"
    GRAMMAR = "grammar"
    """``structured_outputs``."""
    RANDOM = "random"
    """Not greedy: the row draws."""
    MIN_P = "min_p"
    TOP_K = "top_k"
    TOP_P = "top_p"
    TYPICAL_P = "typical_p"
    TOP_N_SIGMA = "top_n_sigma"
    XTC = "xtc"
    UNBOUNDED = "unbounded"
    """A drawing row with none of min-p, top-k, top-p: the torch path's candidate set is the whole vocabulary."""
    TOKEN_ENTRIES = "token_entries"
    """Sparse per-token edits: ``logit_bias``, ``bad_words``, ``min_tokens`` bans (`sampling.token_entries`)."""
    HISTORY = "history"
    """The row's token history on the device (penalties, DRY, multi-token bad words)."""
    MAY_MASK_ALL = "may_mask_all"
    """``allowed_token_ids`` with multi-token bad words: a step may leave no token (checked on the device)."""


TRUNCATIONS = (Feature.MIN_P, Feature.TOP_K, Feature.TOP_P, Feature.TYPICAL_P, Feature.TOP_N_SIGMA, Feature.XTC)
"""In the order the torch path applies them."""


def row_features(params: SamplingParams) -> set[Feature]:
    """The pipeline stages a request needs by its parameters alone (`SamplingBatch.add_request` adds
    the ones its bad words and bans need)."""
    features: set[Feature] = set()
    if params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        features.add(Feature.PENALTIES)
    if uses_dry(params):
        features.add(Feature.DRY)
    if params.allowed_token_ids is not None:
        features.add(Feature.ALLOWED)
    if params.logprobs is not None:
        features.add(Feature.LOGPROBS)
    if params.structured_outputs is not None:
        features.add(Feature.GRAMMAR)
    if params.is_greedy:
        return features
    features.add(Feature.RANDOM)
    truncations = {
        Feature.MIN_P: params.min_p > 0.0,
        Feature.TOP_K: params.top_k > 0,
        Feature.TOP_P: params.top_p < 1.0,
        Feature.TYPICAL_P: params.typical_p < 1.0,
        Feature.TOP_N_SIGMA: params.top_n_sigma > 0.0,
        Feature.XTC: params.xtc_probability > 0.0 and params.xtc_threshold <= 0.5,
    }
    features |= {feature for feature, used in truncations.items() if used}
    if not (truncations[Feature.MIN_P] or truncations[Feature.TOP_K] or truncations[Feature.TOP_P]):
        features.add(Feature.UNBOUNDED)
    return features
