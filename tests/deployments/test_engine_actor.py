"""EngineActor's body in-process (no Ray): refusals, a full queue, and coalesced outputs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deployments.engine_actor import SERVER_FULL, EngineActor, NewRequest
from engine.config import EngineConfig
from engine.outputs import EngineOutput, FinishReason
from engine.request import Request
from sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_full_queue_invalid_requests_and_coalesced_outputs():
    async def run() -> None:
        actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=1, max_model_len=64), max_waiting_requests=2)
        try:
            await actor.ready()
            await check(actor)
        finally:
            await actor.shutdown()

    async def check(actor: EngineActor) -> None:
        requests = [NewRequest(f"r{i}", [100 + i, 200], PARAMS) for i in range(3)]
        errors = (await actor.add_requests("ingress-a", [NewRequest("empty", [], PARAMS), *requests])).errors
        assert errors[0] is not None and "empty" in errors[0].message and errors[0].status == 400
        assert errors[1:] == [None, None, SERVER_FULL]
        tokens: dict[str, list[int]] = {}
        finished: set[str] = set()
        messages = 0
        while len(finished) < 2:
            await asyncio.sleep(0.05)  # let several steps' outputs pile up
            outputs = (await actor.get_outputs("ingress-a", 5.0, [])).outputs
            messages += 1
            for output in outputs:
                tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
                if output.finish_reason is not None:
                    finished.add(output.request_id)
            assert messages < 200
        assert {k: len(v) for k, v in tokens.items()} == {"r0": 6, "r1": 6}
        assert messages < 12  # 12 steps of outputs arrived in fewer messages
        assert (await actor.get_outputs("ingress-b", 0.05, [])).outputs == []

    asyncio.run(run())


def test_callers_cancelled_before_their_command_ran_do_not_stop_the_engine():
    """A Ray actor call is cancelled when the request that made it is (its client left); the
    engine thread must skip such a command, not fail on the cancelled future and exit."""

    async def run() -> None:
        actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=1, max_model_len=64), max_waiting_requests=2)
        try:
            await actor.ready()
            gate = threading.Event()
            actor.engine.abort_requests = lambda request_ids: gate.wait()  # holds the engine thread in a command
            blocker = asyncio.create_task(actor.abort_requests(["r-blocking"]))
            calls = [asyncio.create_task(actor.stats()) for _ in range(8)]
            await asyncio.sleep(0.1)  # each call has queued its command behind the blocking one
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            gate.set()
            await blocker
            assert (await actor.add_requests("ingress-a", [NewRequest("r0", [100, 200], PARAMS)])).errors == [None]
            tokens = 0
            for _ in range(100):
                outputs = (await actor.get_outputs("ingress-a", 5.0, [])).outputs
                tokens += sum(len(o.new_token_ids) for o in outputs)
                if any(o.finish_reason is not None for o in outputs):
                    break
            assert tokens == PARAMS.max_tokens
        finally:
            await actor.shutdown()

    asyncio.run(run())


def test_a_request_failing_in_a_step_gets_an_error_output_and_the_engine_goes_on():
    async def run() -> None:
        actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=2, max_model_len=64), max_waiting_requests=2)
        try:
            await actor.ready()
            add_request = actor.engine.runner.add_request

            def add_or_raise(request: Request) -> None:
                if request.request_id == "bad":
                    raise RuntimeError("injected")
                add_request(request)

            actor.engine.runner.add_request = add_or_raise  # type: ignore[method-assign]
            added = await actor.add_requests("ingress-a", [NewRequest(rid, [100, 200], PARAMS) for rid in ("bad", "good")])
            assert added.errors == [None, None]
            tokens: dict[str, list[int]] = {"good": []}
            last: dict[str, EngineOutput] = {}
            for _ in range(100):
                for output in (await actor.get_outputs("ingress-a", 5.0, [])).outputs:
                    tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
                    last[output.request_id] = output
                if len(last) == 2 and all(o.finish_reason is not None for o in last.values()):
                    break
            assert last["bad"].finish_reason == FinishReason.ERROR and "injected" in last["bad"].error.message
            assert not last["bad"].error.client_fault and len(tokens["good"]) == PARAMS.max_tokens
            assert actor.thread.is_alive() and (await actor.stats())["incarnation"] == actor.incarnation
        finally:
            await actor.shutdown()

    asyncio.run(run())


class _ThreadRecordingActor(EngineActor):
    """Records the threads that load the engine and run its steps."""

    def _load(self, config: EngineConfig):
        self.threads = {"load": threading.get_ident()}
        engine = super()._load(config)
        step = engine.step

        def recorded_step():
            self.threads["step"] = threading.get_ident()
            return step()

        engine.step = recorded_step
        return engine


def test_the_engine_loads_on_the_thread_that_steps_it():
    """torch's OpenMP parallel regions are several times slower on any thread but the first to open
    one, so the model must not be loaded (and touched by torch) on the actor's own thread."""

    async def run() -> None:
        actor = _ThreadRecordingActor(EngineConfig(model="tiny-random", max_num_seqs=1, max_model_len=64), max_waiting_requests=2)
        try:
            await actor.ready()
            await actor.add_requests("ingress-a", [NewRequest("r0", [100, 200], PARAMS)])
            while "step" not in actor.threads:
                await actor.get_outputs("ingress-a", 5.0, [])
        finally:
            await actor.shutdown()
        assert actor.threads["load"] == actor.threads["step"] == actor.thread.ident != threading.get_ident()

    asyncio.run(run())


def test_a_model_that_fails_to_load_fails_the_actor_with_its_error():
    with pytest.raises(FileNotFoundError):
        EngineActor(EngineConfig(model="/nonexistent/model.gguf"), max_waiting_requests=2)
