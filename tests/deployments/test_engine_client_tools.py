"""`EngineClient.stream` and `collect` with tool calls, in-process, against an engine handle that
emits a scripted output a few tokens per poll: the streamed calls join into the whole
response's calls, the text around them is the same, and the choice finishes with "tool_calls";
a forced call cut by the length limit is a call in both, its arguments streamed piece by piece."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments.detok_pool import DetokClient
from deployments.engine_actor import Added, Polled
from deployments.engine_client import EngineClient
from deployments.metrics import IngressMetrics, ReplicaState
from deployments.openai.protocol import ChatCompletionRequest, StreamUsage
from deployments.openai.responses import ResponseFormat
from deployments.openai.tool_calls import ChoiceToolCalls, tool_call_output
from deployments.prompt_encoder import PromptEncoder
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams
from tests.deployments.test_engine_client import Remote, loopback_channel

TOKENIZER = load_tokenizer(DEFAULT_MODEL)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
SCRIPT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'


class ScriptedEngine:
    """Answers every added request with ``script``'s tokens, ``per_poll`` at a time, then finishes with ``finish``."""

    def __init__(self, per_poll: int, script: str = SCRIPT, finish: FinishReason = FinishReason.STOP) -> None:
        self.per_poll = per_poll
        self.script, self.finish = script, finish
        self.pending: dict[str, list[int]] = {}
        self.channel_address = Remote(loopback_channel(self._outputs, self._add, self._abort).address)

    async def _add(self, subscriber: str, requests: list) -> Added:
        for request in requests:
            self.pending[request.request_id] = TOKENIZER.encode(self.script, add_special_tokens=False)
        return Added(1, [None] * len(requests))

    async def _abort(self, request_ids: list[str]) -> int:
        return 1

    async def _outputs(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        await asyncio.sleep(0.001)
        outputs = []
        for request_id, ids in list(self.pending.items()):
            step, rest = ids[: self.per_poll], ids[self.per_poll :]
            finish = None if rest else self.finish
            outputs.append(EngineOutput(request_id, step, 1, finish_reason=finish))
            if rest:
                self.pending[request_id] = rest
            else:
                del self.pending[request_id]
        return Polled(1, outputs)


def response_format(parallel: bool = True, tool_choice: object = "auto") -> ResponseFormat:
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER], parallel_tool_calls=parallel, tool_choice=tool_choice
    )
    return ResponseFormat.new("chatcmpl-x", "m", chat=True, tool_calls=tool_call_output(body, "hermes", 1024))


async def run(
    per_poll: int,
    streaming: bool,
    parallel: bool = True,
    engine: ScriptedEngine | None = None,
    tool_choice: object = "auto",
    metrics: IngressMetrics | None = None,
):
    detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=1 << 20, tokens_per_call=256)
    metrics = metrics or IngressMetrics("tiny-random", "test-replica")
    client = EngineClient([engine or ScriptedEngine(per_poll)], "sub", PromptEncoder(TOKENIZER), detok, metrics)
    fmt = response_format(parallel, tool_choice)
    submission = await client.submit(fmt, [TOKENIZER.encode("Weather?")], SamplingParams(max_tokens=None), echo=False)
    if not streaming:
        return await client.collect(submission)
    return [
        json.loads(frame[len("data: ") :])
        for part in [f async for f in client.stream(submission, StreamUsage(final=False, continuous=False)).frames]
        for frame in part.split("\n\n")
        if frame.startswith("data: {")
    ]


def joined(chunks: list[dict]) -> tuple[str, list[dict], str | None]:
    """The streamed content, the calls joined by index (the first piece of each has its id, type and name), and the finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            for fragment in choice["delta"].get("tool_calls", []):
                if fragment["index"] not in calls:
                    calls[fragment["index"]] = {"id": fragment["id"], "type": fragment["type"], "name": fragment["function"]["name"], "arguments": ""}
                else:
                    assert set(fragment) == {"index", "function"} and set(fragment["function"]) == {"arguments"}
                calls[fragment["index"]]["arguments"] += fragment["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("per_poll", [1, 3, 1000])
def test_streamed_calls_join_into_the_whole_responses_calls(per_poll):
    whole = asyncio.run(run(per_poll, streaming=False))["choices"][0]
    content, calls, finish = joined(asyncio.run(run(per_poll, streaming=True)))
    assert whole["finish_reason"] == finish == "tool_calls"
    assert whole["message"]["content"] == content == "Let me check.\n\n"
    expected = [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole["message"]["tool_calls"]] == expected
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == expected
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_without_parallel_calls_the_stream_keeps_the_first():
    _, calls, _ = joined(asyncio.run(run(2, streaming=True, parallel=False)))
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Oslo"}]


NAMED = {"type": "function", "function": {"name": "get_weather"}}
CUT_ARGUMENTS = '{"city":"Oslo","extra_property_1":"a long value","extra_property_2":"another long val'


@pytest.mark.parametrize("tool_choice, script", [(NAMED, CUT_ARGUMENTS), ("required", '[{"name":"get_weather","arguments":' + CUT_ARGUMENTS)])
def test_a_forced_call_cut_by_max_tokens_is_a_call_streamed_piece_by_piece(tool_choice, script):
    def engine() -> ScriptedEngine:
        return ScriptedEngine(2, script, FinishReason.LENGTH)

    whole = asyncio.run(run(2, streaming=False, engine=engine(), tool_choice=tool_choice))["choices"][0]
    chunks = asyncio.run(run(2, streaming=True, engine=engine(), tool_choice=tool_choice))
    content, calls, finish = joined(chunks)
    assert whole["finish_reason"] == finish == "length"
    assert whole["message"]["content"] is None and content == ""
    ((name, arguments),) = [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]]
    assert (name, arguments) == ("get_weather", CUT_ARGUMENTS)
    assert [(c["name"], c["arguments"]) for c in calls] == [(name, arguments)]
    pieces = [f for chunk in chunks for choice in chunk["choices"] for f in choice["delta"].get("tool_calls", [])]
    assert len(pieces) > 10  # as generated, a few tokens per chunk, not in one piece at the end


def test_a_fault_nobody_foresaw_ends_the_stream_with_an_error_frame(monkeypatch):
    """Whatever raises while a response streams (here the tool-call reader), the stream ends with
    an OpenAI error frame and [DONE], never cut."""

    def broken(self, text, finished):
        raise RecursionError("deep")

    monkeypatch.setattr(ChoiceToolCalls, "feed", broken)

    async def frames() -> str:
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=1 << 20, tokens_per_call=256)
        client = EngineClient([ScriptedEngine(3)], "sub", PromptEncoder(TOKENIZER), detok, IngressMetrics("tiny-random", "test-replica"))
        submission = await client.submit(response_format(), [TOKENIZER.encode("Weather?")], SamplingParams(max_tokens=None), echo=False)
        return "".join([f async for f in client.stream(submission, StreamUsage(final=False, continuous=False)).frames])

    text = asyncio.run(frames())
    assert text.endswith(
        'data: {"error": {"message": "internal server error", "type": "server_error", "param": null, "code": "internal_server_error"}}\n\ndata: [DONE]\n\n'
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_a_finished_request_is_counted_once_under_its_replica(streaming):
    metrics = IngressMetrics("tiny-random", "replica-x")
    asyncio.run(run(3, streaming=streaming, metrics=metrics))
    text = metrics.render([], ReplicaState(live_choices=0, detok_inline_share=1.0)).decode()
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples["spout:request_success_total"].labels == {"model_name": "tiny-random", "replica": "replica-x", "finished_reason": "stop"}
    assert samples["spout:request_success_total"].value == 1
    assert samples["spout:e2e_request_latency_seconds_count"].value == samples["spout:time_to_first_token_seconds_count"].value == 1
    assert samples["spout:prompt_tokens_total"].value == len(TOKENIZER.encode("Weather?"))
    assert samples["spout:generation_tokens_total"].value == len(TOKENIZER.encode(SCRIPT, add_special_tokens=False))
