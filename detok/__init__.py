"""Exact incremental detokenization and stop strings, as a pure batched function over carried state.

Imports only ``tokenizers``, ``sampling.params`` and itself.
"""

from detok.api import DetokItem, DetokResult, StopHit
from detok.batch import detokenize_batch
from detok.state import DetokParams, DetokState, initial_state
from detok.thinking import AnswerRules, ThinkingTags
from detok.token_strings import TokenString

__all__ = [
    "AnswerRules",
    "DetokItem",
    "DetokParams",
    "DetokResult",
    "DetokState",
    "StopHit",
    "ThinkingTags",
    "TokenString",
    "detokenize_batch",
    "initial_state",
]
