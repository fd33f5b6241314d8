"""Runs scheduled steps on the device: forward, gather last positions, lm_head, sample, copy to the host."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from engine.beam.rows import BeamRows, candidate_tensors
from engine.beam.search import Candidates
from engine.config import EngineConfig
from engine.decode_graphs import DecodeGraphs, cuda_graph_capture
from engine.grammar.masks import PendingMasks
from engine.host_allocator import keep_freed_memory
from engine.kernels import paged_attention, rms_norm, rope_cache
from engine.kv.kv_cache import PagedKVCache, host_available_bytes, pool_num_blocks
from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import build_attention_metadata
from engine.models.cpu_decode import CpuDecode
from engine.models.llama import LlamaForCausalLM, merge_projections, use_rms_norm_kernel
from engine.models.packed_linear import can_pack, pack_linears
from engine.models.prompt_tiles import TILES_MEMORY_FRACTION, cpu_has_amx
from engine.models.quant_linear import add_prompt_tiles, can_compute_quantized, prompt_tiles_bytes, quantize_linears
from engine.outputs import TokenLogprobs
from engine.prompt_logprobs import PromptLogprobsInFlight, PromptRows, launch_prompt_logprobs
from engine.request import Request
from engine.scheduler import ScheduledStep
from sampling.batch import SamplingBatch
from sampling.device_copy import to_device, values_to_device
from sampling.ops.masks import GrammarMask
from sampling.params import SamplingParams
from sampling.sampler import Sampler, SamplerOutput
from sampling.tokenized import TokenizedStrings

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

    last_token_ids: [len(step.sampled)] int64 on the device, each request's last sampled
    token, for the next step's inputs.
    host: pinned host copies being filled: token ids per logits row, then (when the step
    verifies drafts) tokens emitted per request, then logprob fields when asked.
    prompt_logprobs: the step's prompt logprobs, when its prefill chunks score any.
    """

    step: ScheduledStep
    last_token_ids: torch.Tensor | None
    host: list[torch.Tensor]
    done: torch.cuda.Event | None
    verifies_drafts: bool
    prompt_logprobs: PromptLogprobsInFlight | None = None
    beam_host: list[torch.Tensor] = field(default_factory=list)
    """Pinned host copies of the beam rows' candidates (`candidate_tensors`), when the step has any."""
    beam_sequences: frozenset[Request] = frozenset()
    """The sampled requests those rows are of (`BeamRows.sequences`)."""


@dataclass
class SampledTokens:
    """What one step sampled for one request: ``token_ids`` in order (accepted drafts, then the
    corrected or bonus token), ``logprobs`` one per token when the batch asked for any."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    candidates: Candidates | None = None
    """A beam-search sequence's next-token candidates (its sampled token is not used)."""


class ModelRunner:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig, eos_token_ids: tuple[int, ...]) -> None:
        self.device, self.dtype = resolve_device(config)
        if self.device.type == "cpu":
            torch.set_num_threads(config.cpu_threads or len(os.sched_getaffinity(0)))
            keep_freed_memory()
        torch.manual_seed(config.seed)
        with torch.device(self.device):  # built where it runs: an 8B model would not fit twice in host memory
            model = LlamaForCausalLM(checkpoint.config, max_positions=config.max_model_len)
        self.model = model.to(dtype=self.dtype).eval()
        self.model.load_weights(checkpoint.weights)
        self.model.rope.to(dtype=torch.float32)
        if can_pack(self.device, self.dtype):
            pack_linears(self.model.layers)
        if self.device.type == "cuda":  # one matmul for q, k and v, one for gate and up: fewer launches a step
            merge_projections(self.model.layers, dense=True)
        self.quantized = config.quantized_weights and can_compute_quantized(self.device, self.dtype, checkpoint.quantized)
        if self.quantized:
            self._keep_quantized(checkpoint)
        self.prompt_tiles = self._wants_prompt_tiles(config.bf16_prompt_matmuls)
        if self.prompt_tiles:
            logger.info("prompt tokens' matmuls in bfloat16 tiles on AMX: %d layers", add_prompt_tiles(self.model.layers))
        num_blocks = pool_num_blocks(config, checkpoint.config, self.dtype, self.device)
        self.kv_cache = PagedKVCache(checkpoint.config, num_blocks, config.block_size, self.dtype, self.device)
        self.sampling_batch = SamplingBatch(config.max_num_seqs, checkpoint.config.vocab_size, config.max_model_len, self.device, eos_token_ids=eos_token_ids)
        self.sampler = Sampler()
        # On the CPU the [N, vocab] logits cost more to write and read than to compute: a batch that
        # only needs their argmax takes it from the lm_head in vocabulary chunks (on CUDA they are cheap).
        self.fuse_argmax = self.device.type == "cpu"
        self.pinned = self.device.type == "cuda"
        # Decode attention reads the paged cache in a kernel: Triton on CUDA, C++ on the CPU in float32
        # where it builds (`engine.kernels.paged_attention`); elsewhere blocks are gathered for SDPA.
        self.paged_decode_kernel = self.device.type == "cuda" or paged_attention.can_decode(self.device, self.dtype, checkpoint.config.head_dim)
        # Queries and keys are rotated and the cache written in one kernel: Triton on CUDA, C++ on the CPU
        # in float32 where it builds (`engine.kernels.rope_cache`); elsewhere by torch's operations.
        head_dim = checkpoint.config.head_dim
        self.rope_kernel = (self.device.type == "cuda" and head_dim % 2 == 0) or rope_cache.can_fuse(self.device, self.dtype, head_dim)
        if rms_norm.can_fuse(self.device, self.dtype, checkpoint.config.hidden_size):
            use_rms_norm_kernel(self.model)
        self.decode_graphs = self._capture_decode_graphs(config) if config.cuda_graphs and self.device.type == "cuda" else None
        self.cpu_decode = CpuDecode.of(self.model) if self.quantized else None
        logger.info("model on %s as %s (%d torch threads)", self.device, self.dtype, torch.get_num_threads())

    def _wants_prompt_tiles(self, asked: bool | None) -> bool:
        """Whether to compute prompt tokens in bfloat16 tiles (`engine.models.prompt_tiles`): where asked, or by
        default (None) while their weights fit in `TILES_MEMORY_FRACTION` of the host's available memory."""
        if asked is False:
            return False
        if not (self.quantized and cpu_has_amx()):
            if asked:
                logger.warning("bf16_prompt_matmuls needs a float32 CPU model with quantized weights and a CPU with AMX: prompt tokens stay float32")
            return False
        if asked is None:
            size, available = prompt_tiles_bytes(self.model.layers), host_available_bytes()
            if size > TILES_MEMORY_FRACTION * available:
                logger.info("prompt tokens stay float32: their bfloat16 tiles would take %d MiB of %d available", size >> 20, available >> 20)
                return False
        return True

    def _keep_quantized(self, checkpoint: Checkpoint) -> None:
        """Compute the checkpoint's 4-bit and 8-bit matrices from their blocks (`engine.models.quant_linear`)."""
        head_name = "embed_tokens.weight" if checkpoint.config.tie_word_embeddings else "lm_head.weight"
        head = checkpoint.quantized.get(head_name)
        self.model.head_blocks = head if head is not None and head.shape[0] % 4 == 0 else None  # the kernel takes rows four at a time
        replaced = quantize_linears(self.model.layers, {name.removeprefix("layers."): w for name, w in checkpoint.quantized.items()})
        merged_groups = merge_projections(self.model.layers)
        logger.info(
            "%d linear layers%s compute from their quantized blocks (%d groups of projections merged)",
            len(replaced),
            " and the output head" if self.model.head_blocks else "",
            merged_groups,
        )

    @torch.inference_mode()
    def launch(
        self,
        step: ScheduledStep,
        previous: InFlightStep | None,
        masks: PendingMasks | None = None,
        prompt_rows: PromptRows | None = None,
        beam_rows: BeamRows | None = None,
    ) -> InFlightStep:
        """Enqueue the step: forward, lm_head on the needed rows, guidance, sampler (or
        verification of drafts), and the copies to the host; prompt logprobs of ``prompt_rows``,
        next-token candidates of ``beam_rows``.

        ``masks``: the grammar bitmasks of the step's constrained requests, filling on a worker
        while the forward pass is enqueued (on the CPU: while it runs); waited for before the sampler.

        Decode inputs still unknown on the host (``step.placeholder_inputs``) are taken on the
        device from ``previous``'s sampled ids, so nothing waits for the previous step.
        """
        self.kv_cache.copy_blocks(step.block_copies)
        input_ids = self._to_device(step.input_ids)
        if step.placeholder_inputs:
            assert previous is not None and previous.last_token_ids is not None
            order = {id(request): index for index, request in enumerate(previous.step.sampled)}
            targets = self._to_device([flat for flat, _ in step.placeholder_inputs])
            sources = self._to_device([order[id(request)] for _, request in step.placeholder_inputs])
            # A previous row left with no token (-1) ends its request when that step is collected, after this
            # launch: any valid id will do here, and -1 would index the embedding out of range (on CUDA a
            # device-side assert that ends the process).
            input_ids[targets] = previous.last_token_ids[sources].clamp(min=0)
        hidden = self._forward(input_ids, step)
        verifies_drafts = any(step.draft_token_ids)
        prompt = None if prompt_rows is None else launch_prompt_logprobs(prompt_rows, hidden, self.model.compute_logits, self.pinned)
        if not step.sampled:
            return InFlightStep(step, None, [], None, verifies_drafts, prompt)
        rows = self._to_device([r.slot for r in step.sampled])
        if verifies_drafts:
            logits = self._guided_logits(step, hidden)
            drafts = [token for request_drafts in step.draft_token_ids for token in [*request_drafts, -1]]
            cu_num_rows = torch.tensor(list(accumulate((len(d) + 1 for d in step.draft_token_ids), initial=0)))
            grammar = self._grammar_mask(masks)
            output = self.sampler.verify(logits, rows, self._to_device(drafts), cu_num_rows, self.sampling_batch, grammar)
            values = [output.token_ids, output.num_emitted]
            last_token_ids = output.token_ids[to_device(cu_num_rows[:-1], self.device) + output.num_emitted - 1]
        else:
            output = self._sample(step, hidden, rows, masks)
            values = [output.sampled_token_ids]
            last_token_ids = output.sampled_token_ids
        if output.logprobs is not None:
            lp = output.logprobs
            values += [lp.token_logprobs, lp.token_ranks, lp.top_ids, lp.top_logprobs]
        beams = [] if beam_rows is None else self._beam_candidates(beam_rows, hidden)
        host = [torch.empty(v.shape, dtype=v.dtype, pin_memory=self.pinned) for v in values + beams]
        for buffer, value in zip(host, values + beams):
            buffer.copy_(value, non_blocking=self.pinned)
        done = torch.cuda.Event() if self.pinned else None
        if done is not None:
            done.record()
        beam_sequences = frozenset() if beam_rows is None else frozenset(beam_rows.sequences)
        return InFlightStep(step, last_token_ids, host[: len(values)], done, verifies_drafts, prompt, host[len(values) :], beam_sequences)

    def _forward(self, input_ids: torch.Tensor, step: ScheduledStep) -> torch.Tensor:
        """input_ids: [T] -> final-normed hidden states [T, hidden]: a decode step from its captured graph on CUDA or
        through the CPU's kernels without module calls (`CpuDecode`), any other step by the modules."""
        if self.decode_graphs is not None and self.decode_graphs.fits(step.chunks):
            return self.decode_graphs.run(input_ids, step.chunks)
        meta = build_attention_metadata(step.chunks, self.kv_cache.block_size, self.device, self.paged_decode_kernel, self.rope_kernel, self.prompt_tiles)
        if self.cpu_decode is not None and self.cpu_decode.fits(meta):
            return self.cpu_decode(input_ids, meta, self.kv_cache.keys, self.kv_cache.values)
        return self.model(input_ids, meta, self.kv_cache.keys, self.kv_cache.values)

    def _capture_decode_graphs(self, config: EngineConfig) -> DecodeGraphs | None:
        """The decode graphs, or None (decode steps then run eagerly, and the error is logged) if capturing failed."""
        started = time.perf_counter()
        try:
            capture = cuda_graph_capture(torch.cuda.graph_pool_handle())
            graphs = DecodeGraphs(self.model, self.kv_cache, config.max_num_seqs, config.max_model_len, capture, self.rope_kernel)
        except RuntimeError:
            logger.exception("capturing the decode graphs failed: decode steps run eagerly")
            return None
        logger.info("captured %d decode graphs (batch 1 to %d) in %.1f s", len(graphs.buckets), graphs.buckets[-1], time.perf_counter() - started)
        return graphs

    def _beam_candidates(self, rows: BeamRows, hidden: torch.Tensor) -> list[torch.Tensor]:
        """The beam rows' candidates (`candidate_tensors`) from their own lm_head rows."""
        logits = self.model.compute_logits(hidden[self._to_device(rows.logits_indices)])
        return candidate_tensors(logits, rows)

    def _sample(self, step: ScheduledStep, hidden: torch.Tensor, rows: torch.Tensor, masks: PendingMasks | None) -> SamplerOutput:
        """One token per sampled request: the lm_head's argmax when the batch needs nothing else
        and fusing pays, else the sampler on the (guided) logits, grammar masks applied."""
        if self.fuse_argmax and not step.guided_rows and self.sampling_batch.argmax_only:
            token_ids = self.model.argmax_logits(hidden[self._to_device(step.logits_indices)])
            return self.sampler.record_argmax(token_ids, rows, self.sampling_batch)
        logits = self._guided_logits(step, hidden)
        return self.sampler(logits, rows, self.sampling_batch, self._grammar_mask(masks))

    def _grammar_mask(self, masks: PendingMasks | None) -> GrammarMask | None:
        """Wait for the bitmasks being filled and send them to the device."""
        if masks is None:
            return None
        bitmask = to_device(masks.bitmask.result(), self.device)
        return GrammarMask(bitmask, self._to_device(masks.rows))

    def _guided_logits(self, step: ScheduledStep, hidden: torch.Tensor) -> torch.Tensor:
        """[len(step.logits_indices), V] logits; guided rows get ``l_u + scale * (l_c - l_u)``."""
        logits = self.model.compute_logits(hidden[self._to_device(step.logits_indices + step.companion_logits_indices)])
        num_rows = len(step.logits_indices)
        if not step.guided_rows:
            return logits
        conditional, unconditional = logits[:num_rows], logits[num_rows:]
        guided_rows = self._to_device(step.guided_rows)
        scales = values_to_device(step.guidance_scales, logits.dtype, self.device)[:, None]
        conditional[guided_rows] = unconditional + scales * (conditional[guided_rows] - unconditional)
        return conditional

    def _to_device(self, values: list[int]) -> torch.Tensor:
        return values_to_device(values, torch.int64, self.device)

    def collect(self, in_flight: InFlightStep) -> list[SampledTokens]:
        """Wait for this step's copies only (an event, not a device-wide sync); one entry per
        ``step.sampled`` request (logprobs: top-N at the batch's largest N, if any row asked)."""
        if in_flight.done is not None:
            in_flight.done.synchronize()
        if not in_flight.host:
            return []
        fields = [buffer.tolist() for buffer in in_flight.host]
        token_ids = fields.pop(0)
        num_rows = [len(drafts) + 1 for drafts in in_flight.step.draft_token_ids]
        num_emitted = fields.pop(0) if in_flight.verifies_drafts else num_rows
        logprobs = [TokenLogprobs(*entry) for entry in zip(*fields)] if fields else None
        beams = iter(Candidates(*row) for row in zip(*(buffer.tolist() for buffer in in_flight.beam_host)))
        sampled, first_row = [], 0
        for request, rows, emitted in zip(in_flight.step.sampled, num_rows, num_emitted):
            emitted_rows = slice(first_row, first_row + emitted)
            candidates = next(beams) if request in in_flight.beam_sequences else None
            sampled.append(SampledTokens(token_ids[emitted_rows], logprobs[emitted_rows] if logprobs is not None else None, candidates))
            first_row += rows
        return sampled

    def validate(self, params: SamplingParams, strings: TokenizedStrings) -> None:
        """Raise ``ValueError`` if the sampler cannot take ``params`` (checked before a request is queued)."""
        self.sampling_batch.validate(params, strings)

    def add_request(self, request: Request) -> None:
        assert request.slot is not None
        self.sampling_batch.add_request(request.slot, request.params, request.prompt_token_ids, request.strings)

    def remove_request(self, slot: int) -> None:
        self.sampling_batch.remove_request(slot)
