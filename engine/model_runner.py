"""Runs one scheduled step on the device: forward, gather last positions, lm_head, sample, one D2H copy."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.config import EngineConfig
from engine.kv_cache import KVCache
from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import build_attention_metadata
from engine.models.llama import LlamaForCausalLM
from engine.request import Request, TokenLogprobs
from engine.scheduler import ScheduledStep
from sampling.batch import SamplingBatch
from sampling.sampler import Sampler

logger = logging.getLogger(__name__)


def resolve_device(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """float32 on CPU and bfloat16 on CUDA unless the config says otherwise."""
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, config.dtype) if config.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {config.dtype!r} is not a torch dtype")
    return device, dtype


class HostTransfer:
    """The step's device-to-host copies, into pinned buffers, waited on with one CUDA event
    (not a device-wide sync, not ``.tolist()`` on a device tensor)."""

    def __init__(self, device: torch.device) -> None:
        self.pinned = device.type == "cuda"
        self.event = torch.cuda.Event() if self.pinned else None

    def to_host(self, *values: torch.Tensor) -> list[list]:
        """Device tensors -> nested Python lists, after a single wait."""
        host = []
        for value in values:
            buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pinned)
            buffer.copy_(value, non_blocking=self.pinned)
            host.append(buffer)
        if self.event is not None:
            self.event.record()
            self.event.synchronize()
        return [buffer.tolist() for buffer in host]


class ModelRunner:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig, eos_token_ids: tuple[int, ...]) -> None:
        self.device, self.dtype = resolve_device(config)
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(checkpoint.config, max_positions=config.max_model_len)
        model.load_weights(checkpoint.weights)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rope.to(dtype=torch.float32)
        self.kv_cache = KVCache(checkpoint.config, config.max_num_seqs, config.max_model_len, self.dtype, self.device)
        self.sampling_batch = SamplingBatch(
            config.max_num_seqs, checkpoint.config.vocab_size, config.max_model_len, self.device, eos_token_ids=eos_token_ids
        )
        self.sampler = Sampler()
        self.host_transfer = HostTransfer(self.device)
        logger.info("model on %s as %s", self.device, self.dtype)

    @torch.inference_mode()
    def execute(self, step: ScheduledStep) -> tuple[list[int], list[TokenLogprobs] | None]:
        """Run the step: one sampled token id per ``step.sampled`` request, in order, and
        their logprobs (top-N at the largest N asked in the batch) when any row asks."""
        input_ids = torch.tensor(step.input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        meta = build_attention_metadata(step.chunks, self.device)
        hidden = self.model(input_ids, meta, self.kv_cache.keys, self.kv_cache.values)
        if not step.sampled:
            return [], None
        logits_indices = torch.tensor(step.logits_indices, dtype=torch.int64).to(self.device, non_blocking=True)
        rows = torch.tensor([r.slot for r in step.sampled], dtype=torch.int64).to(self.device, non_blocking=True)
        logits = self.model.compute_logits(hidden[logits_indices])
        output = self.sampler(logits, rows, self.sampling_batch)
        if output.logprobs is None:
            (sampled,) = self.host_transfer.to_host(output.sampled_token_ids)
            return sampled, None
        lp = output.logprobs
        sampled, logprobs, ranks, top_ids, top_logprobs = self.host_transfer.to_host(
            output.sampled_token_ids, lp.token_logprobs, lp.token_ranks, lp.top_ids, lp.top_logprobs
        )
        return sampled, [TokenLogprobs(*entry) for entry in zip(logprobs, ranks, top_ids, top_logprobs)]

    def add_request(self, request: Request, encode: Callable[[str], list[int]]) -> None:
        assert request.slot is not None
        self.sampling_batch.add_request(request.slot, request.params, request.prompt_token_ids, encode=encode)

    def remove_request(self, slot: int) -> None:
        self.sampling_batch.remove_request(slot)
