"""Configuration dataclasses: what the model is, and how the engine runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.fair_share import SchedulingPolicy
from engine.grammar.limits import CompileBudget, GrammarLimits
from sampling.params import MAX_NGRAM_SIZE, MAX_SPECULATIVE_TOKENS

DEFAULT_MODEL = "smollm2-135m-instruct"
BATCHED_TOKENS_BY_DEVICE = {"cpu": 512, "cuda": 8192}
"""``max_num_batched_tokens`` where the config leaves it None, by device type (others take the CPU's).
On the CPU a step of 512 prompt tokens takes about half a second in float32 (550 ms for the default
model), so one long prompt holds every running stream up for no longer than that; a GPU prefills
8,192 tokens of the default model in a few milliseconds, and with 512 a burst of prompts waited
through dozens of eager mixed steps (256 prompts of 128 tokens: TTFT p50 1.4 s on an H200)."""
BATCHED_TOKENS_WITH_PROMPT_TILES = 1024
"""The CPU's default where prompt tokens take bfloat16 tiles (`engine.models.prompt_tiles`): a step of
1,024 prompt tokens then takes 461 ms, no longer than 512 in float32, and a burst of prompts is
prefilled in half as many steps, each decoding request's row paid once a step instead of twice
(64 prompts of 128 tokens at once, in-process, interleaved pairs: TTFT p50 1.93 and 1.78 s against
2.31 and 1.94 at 512)."""


def default_batched_tokens(device_type: str, prompt_tiles: bool) -> int:
    """``max_num_batched_tokens`` where the config leaves it None: `BATCHED_TOKENS_BY_DEVICE`, or with
    prompt tiles (the CPU's only) `BATCHED_TOKENS_WITH_PROMPT_TILES`."""
    if prompt_tiles:
        return BATCHED_TOKENS_WITH_PROMPT_TILES
    return BATCHED_TOKENS_BY_DEVICE.get(device_type, BATCHED_TOKENS_BY_DEVICE["cpu"])


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: dict[str, Any] | None = None


@dataclass(frozen=True)
class EngineConfig:
    """How `EngineCore` runs a model.

    At most ``max_num_seqs`` sequences run at once, each up to ``max_model_len`` positions;
    their keys and values live in blocks of ``block_size`` positions from one pool of
    ``kv_cache_memory`` bytes (None: a share of free memory, see `engine.kv.kv_cache`, but no
    more than ``max_num_seqs`` full-length sequences need), so the tokens that fit in the
    pool bound concurrency. Full blocks are kept for reuse by later prompts that start with
    the same tokens unless ``enable_prefix_caching`` is off. A step schedules at most
    ``max_num_batched_tokens`` tokens (decodes first, then prefill chunks; None: `default_batched_tokens`).
    ``dtype``/``device`` None pick float32 on CPU, bfloat16 on CUDA.
    ``async_scheduling`` None turns it on for CUDA: step N+1 is launched before step
    N's sampled ids reach the host (see `EngineCore.step`). ``cuda_graphs``: on CUDA, decode
    steps replay graphs captured per batch-size bucket at start (`engine.decode_graphs`).

    ``grammar_cache_size`` compiled structured-output grammars are kept (least recently used dropped);
    ``grammar_limits`` bound each grammar's size, memory and per-token cost, ``compile_budget`` the
    uncached compiles at once (per engine and per client) and how long one may take
    (`engine.grammar.compiler`). At most ``max_constrained_rows`` requests with a grammar and
    ``max_beam_rows`` beams run at once (the others wait their turn); 0 refuses them. Either kind
    makes every step synchronous while it runs (see `EngineCore.step`), as speculation does.

    ``quantized_weights``: on the CPU in float32, a GGUF's Q4_0/Q4_1/Q8_0 matrices stay in their
    blocks and are multiplied through them (`engine.models.quant_linear`: the same weights, 4-5x
    fewer bytes a step); False dequantizes them to float32 at load. ``bf16_prompt_matmuls``: with
    them, on a CPU with AMX, prompt tokens' linear layers run in bfloat16 tiles
    (`engine.models.prompt_tiles`: twice as fast a prefill, bfloat16's rounding on prompt tokens;
    every other token stays float32, and a token's result never depends on its batch); None (the
    default) turns them on where the CPU has AMX and their bfloat16 weights take at most a quarter of
    the host's available memory, False keeps every token in float32.

    On the CPU the model computes on ``cpu_threads`` torch threads (None: every core the process
    may run on; a Ray actor would otherwise get ``OMP_NUM_THREADS`` equal to its reserved CPUs).

    ``scheduling_policy``: ``fcfs`` queues requests by arrival and refuses a ``priority`` other than 0;
    ``priority`` queues them by priority (lower first), with a fair share between clients within one,
    and preempts lower priorities for blocks (`engine.scheduler`, `engine.fair_share`).

    ``num_speculative_tokens`` (K) tokens are drafted per step for each decoding
    request by prompt lookup, matching its last ``prompt_lookup_max`` down to
    ``prompt_lookup_min`` tokens; a request may set its own values, 0 turns it off.
    """

    model: str = DEFAULT_MODEL
    dtype: str | None = None
    device: str | None = None
    max_num_seqs: int = 256
    max_model_len: int = 2048
    max_num_batched_tokens: int | None = None
    kv_cache_memory: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    seed: int = 0
    async_scheduling: bool | None = None
    cuda_graphs: bool = True
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    grammar_cache_size: int = 256
    grammar_limits: GrammarLimits = GrammarLimits()
    compile_budget: CompileBudget = CompileBudget()
    max_constrained_rows: int = 64
    max_beam_rows: int = 64
    cpu_threads: int | None = None
    quantized_weights: bool = True
    bf16_prompt_matmuls: bool | None = None
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS

    def __post_init__(self) -> None:
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {self.cpu_threads}")
        if self.max_constrained_rows < 0 or self.max_beam_rows < 0:
            raise ValueError(f"max_constrained_rows and max_beam_rows must be at least 0, got {self.max_constrained_rows} and {self.max_beam_rows}")
        if self.grammar_cache_size < 1:
            raise ValueError(f"grammar_cache_size must be at least 1, got {self.grammar_cache_size}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max <= MAX_NGRAM_SIZE:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max <= {MAX_NGRAM_SIZE}, got {self.prompt_lookup_min} and {self.prompt_lookup_max}")
