"""Batched torch operations of the sampler pipeline, one concern per module."""
