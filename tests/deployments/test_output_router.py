"""The ingress's output routing, in-process: coalesced engine messages and stop strings."""

from __future__ import annotations

import asyncio

import pytest

from deployments.detok_pool import DetokClient
from deployments.engine_actor import Polled
from deployments.metrics import IngressMetrics
from deployments.output_router import OutputRouter, expand_beams, merge_outputs
from deployments.streams import ChoiceStream, Mailbox
from detok import AnswerRules, ThinkingTags, initial_state
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from engine.outputs import EngineOutput, FinishReason, Hypothesis, RequestError
from sampling.params import SamplingParams

TOKENIZER = load_tokenizer(DEFAULT_MODEL)
# ' randomized', '_"', 'uu', then the first two bytes of a three-byte character, then ' Pe'.
IDS = [20182, 46671, 45372, 10283, 2820, 7959]


def test_merge_outputs_keeps_order_and_the_last_finish():
    outputs = [
        EngineOutput("a", [1], 3),
        EngineOutput("b", [2], 3),
        EngineOutput("a", [4, 5], 3),
        EngineOutput("a", [6], 3, FinishReason.LENGTH),
    ]
    merged = merge_outputs(outputs)
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in merged] == [
        ("a", [1, 4, 5, 6], FinishReason.LENGTH),
        ("b", [2], None),
    ]
    assert outputs[0].new_token_ids == [1]  # the engine's outputs are not modified


def test_a_beam_search_output_becomes_one_finished_output_per_beam():
    beams = [Hypothesis((5, 6), -1.5, (), FinishReason.LENGTH), Hypothesis((7, 2), -2.0, (), FinishReason.STOP)]
    other = EngineOutput("x", [9], 3)
    expanded = expand_beams([other, EngineOutput("s", [], 3, FinishReason.STOP, beams=beams)])
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in expanded] == [
        ("x", [9], None),
        ("s/beam0", [5, 6], FinishReason.LENGTH),
        ("s/beam1", [7, 2], FinishReason.STOP),
    ]
    failed = EngineOutput("s", [], 3, FinishReason.ERROR, error=RequestError("broke", False), beams=[Hypothesis((), 0.0, (), FinishReason.ERROR)] * 2)
    assert all(o.error is not None and o.finish_reason == FinishReason.ERROR for o in expand_beams([failed]))


class ScriptedEngine:
    """An engine channel whose long poll returns ``messages`` one per call, then sets ``drained``
    (every message has been routed) and never returns; ``aborts``: those that came with the polls."""

    def __init__(self, messages: list[list[EngineOutput] | Polled]) -> None:
        self.messages = iter(messages)
        self.drained = asyncio.Event()
        self.aborts: list[str] = []

    async def poll(self, timeout_s: float, aborts: list[str]) -> Polled:
        self.aborts += aborts
        message = next(self.messages, None)
        if message is None:
            self.drained.set()
            await asyncio.Event().wait()
        return message if isinstance(message, Polled) else Polled(1, message)


def route(messages: list[list[EngineOutput]], params: SamplingParams, answer: AnswerRules | None = None) -> tuple[str, str | None, list[str]]:
    """Feed engine messages through an OutputRouter; the text, finish reason and aborts."""
    mailbox, aborts = route_to_mailbox(messages, params, answer=answer)
    deltas = mailbox.pending[0]
    return deltas.text, deltas.finish_reason, aborts


def route_to_mailbox(
    messages: list[list[EngineOutput] | Polled], params: SamplingParams, incarnation: int | None = None, answer: AnswerRules | None = None
) -> tuple[Mailbox, list[str]]:
    """Feed engine messages through an OutputRouter to one choice's mailbox; that mailbox and the aborts."""

    async def run() -> tuple[Mailbox, list[str]]:
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        mailbox = Mailbox()
        prompt = TOKENIZER.encode("Hello")
        stream = ChoiceStream("r", 0, 0, mailbox, initial_state(TOKENIZER.tokenizer, prompt, params, answer), incarnation=incarnation)
        engine = ScriptedEngine(messages)
        router = OutputRouter([engine], detok, IngressMetrics("tiny-random", "test-replica"))
        router.register(stream)  # before the router's first poll runs
        await asyncio.wait_for(engine.drained.wait(), 30)
        return mailbox, engine.aborts

    return asyncio.run(run())


def test_a_coalesced_message_decodes_like_separate_ones():
    params = SamplingParams(max_tokens=len(IDS))
    full = TOKENIZER.tokenizer.decode(IDS)
    assert "\ufffd" in full
    separate = [[EngineOutput("r", [token], 1)] for token in IDS[:-1]] + [[EngineOutput("r", IDS[-1:], 1, FinishReason.LENGTH)]]
    coalesced = [[EngineOutput("r", [token], 1) for token in IDS[:-1]] + [EngineOutput("r", IDS[-1:], 1, FinishReason.LENGTH)]]
    assert route(separate, params)[:2] == (full, "length")
    assert route(coalesced, params)[:2] == (full, "length")


def test_a_stop_string_finishes_the_choice_and_aborts_it_once():
    params = SamplingParams(max_tokens=100, stop=["uu"])
    text, finish, aborts = route([[EngineOutput("r", IDS[:3], 1)], [EngineOutput("r", IDS[3:], 1)]], params)
    assert (text, finish, aborts) == (' randomized_"', "stop", ["r"])


def test_a_reasoning_answer_at_its_max_tokens_finishes_with_length_and_aborts_once():
    """With a reasoning parser's rules the engine's limit is above max_tokens: the detokenizer ends the
    answer (an output that opens no thinking is all answer) and the router aborts it, as for a stop string."""
    answer = AnswerRules(ThinkingTags("<think>", "</think>", False), 2)
    text, finish, aborts = route([[EngineOutput("r", IDS[:1], 1)], [EngineOutput("r", IDS[1:4], 1)]], SamplingParams(max_tokens=None), answer)
    assert (text, finish, aborts) == (TOKENIZER.tokenizer.decode(IDS[:2]), "length", ["r"])


@pytest.mark.parametrize(("client_fault", "status"), [(True, 400), (False, 500)])
def test_an_engine_error_output_ends_the_stream_with_its_message(client_fault, status):
    failed = EngineOutput("r", [], 1, FinishReason.ERROR, error=RequestError("row 3 broke", client_fault))
    for messages in ([[EngineOutput("r", IDS[:2], 1)], [failed]], [[EngineOutput("r", IDS[:2], 1), failed]]):
        mailbox, aborts = route_to_mailbox(messages, SamplingParams())
        assert mailbox.error is not None and (mailbox.error.status, mailbox.error.message) == (status, "row 3 broke")
        assert aborts == []  # the engine already finished it


def test_a_replica_the_engine_took_for_dead_ends_its_streams():
    params = SamplingParams(temperature=0.0, max_tokens=100)
    mailbox, _ = route_to_mailbox([[EngineOutput("r", IDS[:1], 1)], Polled(1, [], subscriber_lost=True)], params, incarnation=1)
    assert mailbox.error is not None and mailbox.error.code == "engine_failed"


class AnsweringEngine:
    """An engine channel whose long polls are futures the test answers (``polls``, newest last)."""

    def __init__(self) -> None:
        self.polls: list[asyncio.Future] = []

    def poll(self, timeout_s: float, aborts: list[str]) -> asyncio.Future:
        self.polls.append(asyncio.get_running_loop().create_future())
        return self.polls[-1]


def test_a_cancel_that_races_a_poll_answer_still_ends_the_loop():
    """Cancelled while its poll's answer lands, ``asyncio.wait_for`` (Python 3.11) returns the answer and
    drops the cancel; the loop must still end, or a replica's shutdown waits for it forever."""

    async def run() -> None:
        engine = AnsweringEngine()
        router = OutputRouter([engine], DetokClient(TOKENIZER.tokenizer, None, 0, 1), IngressMetrics("tiny-random", "test-replica"))
        for _ in range(3):
            await asyncio.sleep(0)  # the loop is in its first poll
        assert len(engine.polls) == 1
        engine.polls[0].set_result(Polled(1, []))
        router.tasks[0].cancel()  # before the loop wakes: the answer and the cancel land together
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(router.tasks[0], 5)

    asyncio.run(run())
