"""Exact incremental detokenization and stop strings, as a pure batched function over carried state.

Imports only ``tokenizers``, ``sampling.params`` and itself.
"""

from detok.batch import DetokItem, DetokResult, StopHit, detokenize_batch
from detok.state import DetokState, initial_state
from detok.token_strings import TokenString

__all__ = ["DetokItem", "DetokResult", "DetokState", "StopHit", "TokenString", "detokenize_batch", "initial_state"]
