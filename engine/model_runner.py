"""Runs scheduled steps on the device: forward, gather last positions, lm_head, sample, copy to the host."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.kv_cache import KVCache
from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import build_attention_metadata
from engine.models.llama import LlamaForCausalLM
from engine.request import Request, TokenLogprobs
from engine.scheduler import ScheduledStep
from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.sampler import Sampler

logger = logging.getLogger(__name__)


def resolve_device(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """float32 on CPU and bfloat16 on CUDA unless the config says otherwise."""
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, config.dtype) if config.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {config.dtype!r} is not a torch dtype")
    return device, dtype


@dataclass
class InFlightStep:
    """A launched step whose sampled ids may still be on their way to the host.

    sampled_token_ids: [len(step.sampled)] int64 on the device, for the next step's inputs.
    host: pinned host copies being filled (ids, then logprob fields when asked).
    """

    step: ScheduledStep
    sampled_token_ids: torch.Tensor | None
    host: list[torch.Tensor]
    done: torch.cuda.Event | None


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
        self.pinned = self.device.type == "cuda"
        logger.info("model on %s as %s", self.device, self.dtype)

    @torch.inference_mode()
    def launch(self, step: ScheduledStep, previous: InFlightStep | None) -> InFlightStep:
        """Enqueue the step: forward, lm_head on the sampled rows, sampler, and the copies to the host.

        Decode inputs still unknown on the host (``step.placeholder_inputs``) are taken on the
        device from ``previous``'s sampled ids, so nothing waits for the previous step.
        """
        input_ids = torch.tensor(step.input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        if step.placeholder_inputs:
            assert previous is not None and previous.sampled_token_ids is not None
            order = {id(request): index for index, request in enumerate(previous.step.sampled)}
            targets = torch.tensor([flat for flat, _ in step.placeholder_inputs], dtype=torch.int64)
            sources = torch.tensor([order[id(request)] for _, request in step.placeholder_inputs], dtype=torch.int64)
            input_ids[targets.to(self.device)] = previous.sampled_token_ids[sources.to(self.device)]
        meta = build_attention_metadata(step.chunks, self.device)
        hidden = self.model(input_ids, meta, self.kv_cache.keys, self.kv_cache.values)
        if not step.sampled:
            return InFlightStep(step, None, [], None)
        logits_indices = torch.tensor(step.logits_indices, dtype=torch.int64).to(self.device, non_blocking=True)
        rows = torch.tensor([r.slot for r in step.sampled], dtype=torch.int64).to(self.device, non_blocking=True)
        output = self.sampler(self.model.compute_logits(hidden[logits_indices]), rows, self.sampling_batch)
        values = [output.sampled_token_ids]
        if output.logprobs is not None:
            lp = output.logprobs
            values += [lp.token_logprobs, lp.token_ranks, lp.top_ids, lp.top_logprobs]
        host = [torch.empty(v.shape, dtype=v.dtype, pin_memory=self.pinned) for v in values]
        for buffer, value in zip(host, values):
            buffer.copy_(value, non_blocking=self.pinned)
        done = torch.cuda.Event() if self.pinned else None
        if done is not None:
            done.record()
        return InFlightStep(step, output.sampled_token_ids, host, done)

    def collect(self, in_flight: InFlightStep) -> tuple[list[int], list[TokenLogprobs] | None]:
        """Wait for this step's copies only (an event, not a device-wide sync): one sampled id
        per ``step.sampled`` request, and their logprobs (top-N at the batch's largest N) if asked."""
        if in_flight.done is not None:
            in_flight.done.synchronize()
        if not in_flight.host:
            return [], None
        sampled, *logprob_fields = [buffer.tolist() for buffer in in_flight.host]
        if not logprob_fields:
            return sampled, None
        return sampled, [TokenLogprobs(*entry) for entry in zip(*logprob_fields)]

    def validate(self, params: SamplingParams, encode: Callable[[str], list[int]]) -> None:
        """Raise ``ValueError`` if the sampler cannot take ``params`` (checked before a request is queued)."""
        self.sampling_batch.validate(params, encode)

    def add_request(self, request: Request, encode: Callable[[str], list[int]]) -> None:
        assert request.slot is not None
        self.sampling_batch.add_request(request.slot, request.params, request.prompt_token_ids, encode=encode)

    def remove_request(self, slot: int) -> None:
        self.sampling_batch.remove_request(slot)
