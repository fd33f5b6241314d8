"""`ServeArgs`: every option of the Serve application, validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from deployments.engine_routing import EngineRouting, RoutingPolicy
from deployments.http_server import ServerLimits
from deployments.launch import API_KEY_ENV
from deployments.limits import RequestLimits
from deployments.openai.reasoning import REASONING_PARSERS, ReasoningParser
from deployments.openai.tool_parsers import TOOL_CALL_PARSERS
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.fair_share import SchedulingPolicy
from engine.grammar.limits import CompileBudget, GrammarLimits
from sampling.params import MAX_NGRAM_SIZE, MAX_SPECULATIVE_TOKENS

BLOCK_SIZE = EngineConfig.block_size
QUEUE_SHARE = 4  # one request's choices fill at most this fraction of an engine's waiting queue
DETOK_INLINE_ALWAYS = 1_000_000
"""`ServeArgs.inline_detok_threshold` at which no step goes to the detokenizer pool (the default: on the
measured machines the pool cost the ingress more per token than detokenizing inline; see bench.egress_capacity)."""


class ServeArgs(RequestLimits):
    """Options of ``deployments.build_app`` (``serve run deployments:build_app key=value ...``);
    the per-request limits of `RequestLimits` are options too."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(DEFAULT_MODEL, description="smollm2-135m-instruct, tiny-random, a .gguf file or a Hugging Face folder (see docs/engine.md).")
    served_model_name: str | None = Field(None, description="The name clients use; defaults to `model`.")
    dtype: str | None = Field(None, description="Weights' dtype; default float32 on CPU, bfloat16 on CUDA.")
    max_num_seqs: int = Field(256, ge=1, description="Sequences an engine runs at once; the KV cache's size bounds them too.")
    max_model_len: int = Field(2048, ge=2, description="Context positions per sequence (at most the KV cache's).")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Tokens per engine step: decode tokens and prefill chunks; default 512 on CPU (1024 with bf16_prompt_matmuls), 8192 on CUDA."
    )
    kv_cache_memory: int | None = Field(
        None,
        gt=0,
        description="Bytes of KV cache per engine; default: 10% of the machine's available memory on CPU, 80% of the GPU's free memory, "
        "at most what max_num_seqs sequences of max_model_len positions need.",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="fcfs: each engine's queue in arrival order, and a request's priority other than 0 is refused (400); priority: "
        "lower priority values first, turns between clients within a priority (by X-Client-Id, else address), lower priorities preempted for KV blocks.",
    )
    enable_prefix_caching: bool = Field(True, description="Keep the KV blocks of finished prompts for later prompts that start with them.")
    num_speculative_tokens: int = Field(0, ge=0, le=MAX_SPECULATIVE_TOKENS, description="Prompt-lookup drafts per step; 0: off.")
    prompt_lookup_min: int = Field(2, ge=1, le=MAX_NGRAM_SIZE, description="Shortest n-gram prompt lookup matches.")
    prompt_lookup_max: int = Field(4, ge=1, le=MAX_NGRAM_SIZE, description="Longest n-gram prompt lookup matches.")
    grammar_cache_size: int = Field(256, ge=1, description="Compiled structured-output grammars each engine keeps (least recently used dropped).")
    max_queued_grammar_compiles: int = Field(
        16, ge=1, description="Uncached grammars an engine compiles or queues at once (the choices of a request share one); more get 503."
    )
    max_client_grammar_compiles: int = Field(
        4,
        ge=1,
        description="Of those, how many one client (by its address: behind HAProxy (http_front=serve), the one HAProxy forwards) may bring; more get 429.",
    )
    grammar_compile_timeout_s: float = Field(
        10.0, gt=0, description="A compile that runs longer fails its requests (400); the grammar is then refused at once until it leaves the cache's memory."
    )
    grammar_max_lexer_states: int = Field(
        16_384, ge=1, description="Lexer states one grammar may build, about 1-2 kB each (llguidance's max_lexer_states; its default is 250,000)."
    )
    grammar_initial_lexer_fuel: int = Field(1_000_000, ge=1, description="llguidance's work bound to build a grammar's lexer (about 50k per ms).")
    grammar_step_lexer_fuel: int = Field(200_000, ge=1, description="llguidance's lexer work bound per token's mask (about 14k per ms).")
    grammar_step_max_items: int = Field(50_000, ge=1, description="llguidance's Earley items bound per token's mask (about 20k per ms).")
    grammar_max_items_in_row: int = Field(2000, ge=1, description="Earley items in one row of a parse, kept per token (llguidance's max_items_in_row).")
    grammar_max_size: int = Field(500_000, ge=1, description="Symbols in a grammar's productions (llguidance's max_grammar_size).")
    engine_cpu_threads: int | None = Field(None, ge=1, description="Torch threads of an engine on the CPU; default every core of its node.")
    quantized_weights: bool = Field(
        True, description="On the CPU in float32, a GGUF's 4-bit and 8-bit matrices are multiplied through their blocks; false dequantizes them at load."
    )
    bf16_prompt_matmuls: bool | None = Field(
        None,
        description="With quantized_weights, prompt tokens' linear layers in bfloat16 tiles on AMX (about 2x faster prefill, bfloat16's rounding "
        "on prompt tokens, batch-invariant); default on where the CPU has AMX and the weights' bfloat16 copy takes at most a quarter of the "
        "available memory, false keeps every token in float32.",
    )
    num_engines: int | None = Field(None, ge=1, description="Engine actors; default one per GPU (or per unit of engine_resource), or one CPU engine.")
    engine_routing: Literal["prefix", "least_loaded"] = Field(
        "least_loaded",
        description="Which engine a request goes to. least_loaded: the engine with the fewest live choices. prefix: prompts that start with the "
        "same engine_routing_prefix_tokens tokens go to the same engine (its prefix cache holds them; the least-loaded one when the replica "
        "first sees them), unless it runs more than the load slack above the least-loaded one; shorter prompts go to the least-loaded engine. "
        "For prompts that share long prefixes (see docs/deployment.md).",
    )
    engine_routing_prefix_tokens: int = Field(
        64,
        ge=BLOCK_SIZE,
        multiple_of=BLOCK_SIZE,
        description=f"Leading prompt tokens the prefix routing hashes (a multiple of the KV block, {BLOCK_SIZE}); keep it above the chat "
        "template's header (24 tokens for the default model's) and below the shared system prompts worth routing for.",
    )
    engine_routing_load_slack: int = Field(
        4, ge=0, description="Live choices an engine may run above the least-loaded engine's and still take a prompt for its prefix."
    )
    engine_routing_load_slack_fraction: float = Field(
        0.25, ge=0, description="The same slack in proportion to the least-loaded engine's live choices; the larger of the two applies."
    )
    engine_resource: str | None = Field(
        None, min_length=1, description="A custom Ray resource marking engine places, one engine per unit (accelerators Ray does not count as GPUs; tests)."
    )
    detok_resource: str | None = Field(None, min_length=1, description="A custom Ray resource the nodes for detokenizer replicas offer (e.g. CPU-only nodes).")
    ingress_resource: str | None = Field(None, min_length=1, description="A custom Ray resource marking ingress places, one ingress replica per unit.")
    detok_min_replicas: int = Field(0, ge=0, description="Fewest detokenizer pool replicas; at least 1 when steps go to the pool.")
    detok_max_replicas: int = Field(2, ge=1, description="Most detokenizer pool replicas.")
    detok_tokens_per_call: int = Field(
        256, ge=1, description="A step's pool batch is split into calls of at most this many new tokens; the pool scales to one replica per call."
    )
    detok_upscale_delay_s: float = Field(2.0, ge=0, description="Seconds the pool waits before adding a replica.")
    detok_downscale_delay_s: float = Field(30.0, ge=0, description="Seconds the pool waits before removing a replica.")
    ingress_min_replicas: int = Field(1, ge=1, description="Fewest HTTP ingress replicas; each subscribes to every engine (one carries about 20,000 tokens/s).")
    ingress_max_replicas: int = Field(1, ge=1, description="Most HTTP ingress replicas; above ingress_min_replicas, Serve adds replicas as streams grow.")
    ingress_target_streams: int = Field(
        256, ge=1, description="Requests in flight per ingress replica that the ingress autoscaling aims at (Serve's target_ongoing_requests)."
    )
    ingress_upscale_delay_s: float = Field(10.0, ge=0, description="Seconds the ingress waits above its target before adding a replica.")
    ingress_downscale_delay_s: float = Field(120.0, ge=0, description="Seconds the ingress waits below its target before removing a replica.")
    http_front: Literal["serve", "replica"] = Field(
        "serve",
        description="serve: Serve's HTTP path on Serve's port (HAProxy in front of the replicas' own uvicorn servers on the fast path); "
        "replica: each ingress replica serves http_host:http_port itself (Spout's HTTP/1.1 server, SO_REUSEPORT among a node's "
        "replicas), no HAProxy on the path, autoscaled on the requests each replica's own server has in flight, the app at '/'.",
    )
    http_host: str = Field("127.0.0.1", description="With http_front=replica: the address each ingress replica listens on.")
    http_port: int = Field(8000, ge=1, le=65535, description="With http_front=replica: the port each ingress replica listens on (shared).")
    http_own_port_min: int = Field(
        8001,
        ge=0,
        le=65535,
        description="With http_front=replica: each ingress replica also listens alone on this port plus its rank on its node (a scrape "
        "of /metrics there reaches that replica); 0: no port of its own.",
    )
    http_head_timeout_s: float = Field(
        10.0, gt=0, description="With http_front=replica: a request's head must arrive whole within this long of its connection going idle."
    )
    http_write_timeout_s: float = Field(
        60.0,
        gt=0,
        description="With http_front=replica: a client whose socket takes nothing for this long while a response waits for it is cut off "
        "(its requests aborted).",
    )
    http_max_connections: int = Field(10_000, ge=1, description="With http_front=replica: open connections per ingress replica; more are closed at once.")
    replica_drain_timeout_s: float = Field(
        60.0,
        gt=0,
        description="An ingress or detokenizer replica being removed (scale-down, redeploy) takes no new requests and lets those in flight "
        "(streams included) run this long before it stops (Serve's graceful_shutdown_timeout_s).",
    )
    inline_detok_threshold: int = Field(
        DETOK_INLINE_ALWAYS,
        ge=0,
        description=f"Steps with fewer new tokens than this are detokenized inline in the ingress; {DETOK_INLINE_ALWAYS} (the default): every step.",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        description="Tokens per streamed frame (vLLM's stream_interval): a choice's first token and its last frame go out at once, "
        "the others once this many wait. Larger values cost less CPU per token and make the text arrive in bigger steps.",
    )
    stream_idle_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A request that receives no output for this long (queued, or its engine's messages lost) fails with 504 "
        "stream_timeout (an error frame when streamed) and its engine requests are aborted. Keep it above the longest queue wait you accept.",
    )
    default_max_tokens: int | None = Field(
        4096,
        ge=1,
        description="Tokens a chat completion generates at most when the request sets neither max_tokens nor max_completion_tokens "
        "(never fewer than its min_tokens); null: until the context is full, as vLLM does. Completions keep OpenAI's default of 16.",
    )
    api_key: SecretStr | None = Field(None, description=f"When set, every route but /health requires it; {API_KEY_ENV} sets it from the environment.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Request body bytes, enforced while reading; larger bodies get 413.")
    max_waiting_requests: int = Field(1024, ge=1, description="Queued requests per engine before 503.")
    tool_call_parser: str = Field("hermes", description=f"How tool_choice 'auto' finds the model's tool calls in its text; one of {sorted(TOOL_CALL_PARSERS)}.")
    reasoning_parser: str | None = Field(
        None,
        description=f"How a reasoning model's thinking is split from its answer (chat's reasoning_content, the Responses API's reasoning items, "
        f"the Messages API's thinking blocks); one of {sorted(REASONING_PARSERS)}; unset: no split.",
    )
    max_thinking_tokens: int | None = Field(
        None,
        ge=1,
        description="With a reasoning_parser, max_tokens counts the answer only: a request's thinking may take this many tokens "
        "more (the engine stops the output at max_tokens plus this); null: only the context's room bounds the thinking.",
    )

    @classmethod
    def from_options(cls, options: Mapping[str, object], environ: Mapping[str, str]) -> ServeArgs:
        """``options`` validated; the API key from ``environ[SPOUT_API_KEY]`` when the options set none."""
        if options.get("api_key") is None and API_KEY_ENV in environ:
            options = {**options, "api_key": environ[API_KEY_ENV]}
        return cls(**options)

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value().strip():
            raise ValueError(f"the API key is empty: set a non-empty api_key (or {API_KEY_ENV}), or leave it unset to serve without one")
        return key

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        if name is not None and name not in REASONING_PARSERS:
            raise ValueError(f"no reasoning parser is named {name!r}; there are {sorted(REASONING_PARSERS)}")
        return name

    def reasoning(self) -> ReasoningParser | None:
        return None if self.reasoning_parser is None else REASONING_PARSERS[self.reasoning_parser]

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        if name not in TOOL_CALL_PARSERS:
            raise ValueError(f"no tool call parser is named {name!r}; there are {sorted(TOOL_CALL_PARSERS)}")
        return name

    @model_validator(mode="after")
    def _one_request_cannot_fill_the_queue(self) -> ServeArgs:
        if self.max_choices_per_request * QUEUE_SHARE > self.max_waiting_requests:
            raise ValueError(
                f"max_choices_per_request ({self.max_choices_per_request}) must be at most 1/{QUEUE_SHARE} of max_waiting_requests "
                f"({self.max_waiting_requests}), so that one request cannot fill an engine's queue"
            )
        return self

    @model_validator(mode="after")
    def _a_used_pool_has_a_replica(self) -> ServeArgs:
        if self.inline_detok_threshold < DETOK_INLINE_ALWAYS and self.detok_min_replicas == 0:
            raise ValueError(
                f"inline_detok_threshold {self.inline_detok_threshold} sends larger steps to the detokenizer pool, which then needs "
                f"detok_min_replicas of at least 1 (its autoscaling does not start from none); or leave inline_detok_threshold at {DETOK_INLINE_ALWAYS}"
            )
        return self

    @model_validator(mode="after")
    def _replica_bounds_in_order(self) -> ServeArgs:
        for kind in ("ingress", "detok"):
            low, high = getattr(self, f"{kind}_min_replicas"), getattr(self, f"{kind}_max_replicas")
            if low > high:
                raise ValueError(f"{kind}_min_replicas ({low}) must be at most {kind}_max_replicas ({high})")
        return self

    @model_validator(mode="after")
    def _own_ports_apart_from_the_shared_one(self) -> ServeArgs:
        if self.http_front != "replica" or not (own_ports := self.own_ports()):
            return self
        if self.http_port in own_ports:
            raise ValueError(
                f"http_port {self.http_port} is one of the ingress replicas' own ports (http_own_port_min {self.http_own_port_min} plus "
                f"a rank under ingress_max_replicas {self.ingress_max_replicas}): give http_own_port_min past it, or 0"
            )
        if own_ports[-1] > 65535:
            raise ValueError(f"http_own_port_min {self.http_own_port_min} plus ingress_max_replicas {self.ingress_max_replicas} goes past port 65535")
        return self

    def own_ports(self) -> range:
        """The ports the ingress replicas of one node may listen on alone (``http_front=replica``), rank by
        rank up to ``ingress_max_replicas``; none with ``http_own_port_min`` 0."""
        first = self.http_own_port_min
        return range(first, first + self.ingress_max_replicas) if first else range(0)

    def own_port(self, local_rank: int) -> int | None:
        """The port a replica of rank ``local_rank`` on its node listens on alone, if any."""
        return self.http_own_port_min + local_rank if self.http_own_port_min else None

    def server_limits(self) -> ServerLimits:
        return ServerLimits(head_timeout_s=self.http_head_timeout_s, write_timeout_s=self.http_write_timeout_s, max_connections=self.http_max_connections)

    @model_validator(mode="after")
    def _client_share_within_the_engine(self) -> ServeArgs:
        self.compile_budget()  # raises when the options do not make one
        return self

    def compile_budget(self) -> CompileBudget:
        return CompileBudget(self.max_queued_grammar_compiles, self.max_client_grammar_compiles, self.grammar_compile_timeout_s)

    def grammar_limits(self) -> GrammarLimits:
        return GrammarLimits(
            max_lexer_states=self.grammar_max_lexer_states,
            initial_lexer_fuel=self.grammar_initial_lexer_fuel,
            step_lexer_fuel=self.grammar_step_lexer_fuel,
            step_max_items=self.grammar_step_max_items,
            max_items_in_row=self.grammar_max_items_in_row,
            max_grammar_size=self.grammar_max_size,
        )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def engine_routing_rules(self) -> EngineRouting:
        return EngineRouting(
            RoutingPolicy(self.engine_routing),
            self.engine_routing_prefix_tokens,
            self.engine_routing_load_slack,
            self.engine_routing_load_slack_fraction,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_cache_memory=self.kv_cache_memory,
            enable_prefix_caching=self.enable_prefix_caching,
            num_speculative_tokens=self.num_speculative_tokens,
            prompt_lookup_min=self.prompt_lookup_min,
            prompt_lookup_max=self.prompt_lookup_max,
            grammar_cache_size=self.grammar_cache_size,
            grammar_limits=self.grammar_limits(),
            compile_budget=self.compile_budget(),
            max_constrained_rows=self.max_constrained_rows,
            max_beam_rows=self.max_beam_rows,
            cpu_threads=self.engine_cpu_threads,
            quantized_weights=self.quantized_weights,
            bf16_prompt_matmuls=self.bf16_prompt_matmuls,
            scheduling_policy=SchedulingPolicy(self.scheduling_policy),
        )
