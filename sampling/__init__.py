"""Spout's sampling library: parameters, per-batch state, the sampler pipeline and its kernels.

Kept import-free so that ``sampling.params`` (used by the detokenizer) does not pull in torch.
Modules: `params`, `batch`, `token_entries`, `view`, `sampler`, `logprobs`, `ops.*`, `triton.*`.
"""
