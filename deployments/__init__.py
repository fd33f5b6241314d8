"""The Ray Serve application: ``serve run deployments:app`` (or ``deployments:build_app key=value ...``).

A request's path, and a token's, through this package (the OpenAI wire format it speaks,
with no Ray, is the `deployments.openai` package):

1. `ingress.Ingress` (a Serve replica, reached with ``http_front=replica``, ``make run``'s front, through
   its own `http_server.HttpServer` on the ports `replica_front` opens, or through Serve's HTTP path) reads the body within its limits (`openai.request_body`),
   checks the key (`auth`), validates it (`openai.protocol`), checks every costly field against
   the operator's `limits.RequestLimits`, and encodes the prompt on a worker (`prompt_encoder`).
2. `engine_client.EngineClient.submit` (the replica's client of the engines) tokenizes the
   request's strings once (bad words, DRY breakers, negative prompt), registers one
   `streams.ChoiceStream` per choice with the `output_router.OutputRouter`, and adds them to
   the least loaded live engine in one batched call per tick (`tick_batcher`), on the replica's
   connections to that engine (`engine_channel`: not a Ray call).
3. `engine_actor.EngineActor` (one per GPU, detached, owned by the app, named and placed by
   `engine_placement`) runs `EngineCore`
   on its own thread; each step's new token ids for a replica's requests wait in that
   replica's mailbox. Every reply carries the engine's incarnation; the engine steps at
   most a few steps ahead of what its replicas have routed (`step_credits`).
4. The router's long poll (one per engine, on a connection of its own in `engine_channel`)
   takes a whole step's outputs at once, carrying back the aborts found since
   the last poll; it detokenizes them in one batch, inline or
   on the `detok_pool` deployment, and puts text deltas in each request's `streams.Mailbox`.
   A stop string found there finishes the choice and its abort rides the next poll.
5. `engine_client.EngineClient.deltas`, the one loop over a request's output, hands the mailbox
   deltas to the wire format: SSE frames or a whole body built by `openai.choices` (completions,
   chat), `openai.responses_writer` (Responses) or `anthropic.messages_writer` (Messages), which
   `openai.event_stream.EventStream` writes; a client that leaves aborts its choices at once. Under
   the replica front a one-choice stream's frames are made and written by the router's loop
   itself as it fills the mailbox (`EngineClient.event_stream`), no task woken per token; its task
   writes the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve import Application


def build_app(args: dict[str, str] | None = None) -> Application:
    """`deployments.app.build_app`, imported when first called: Ray and torch load then, so that
    the launcher (``python -m deployments.launch``), which imports this package, starts at once."""
    from deployments.app import build_app as build

    return build(args)


def __getattr__(name: str) -> Application:
    """``deployments:app``, the app with the defaults, built when Serve asks for it."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module 'deployments' has no attribute {name!r}")


__all__ = ["app", "build_app"]
