"""The OpenAI wire format, with no Ray: what a client sends and what it gets back.

- `protocol`: the request models (completions, chat completions) and their validation;
- `request_body`: reading a body within its byte limit and parsing it (deep or large JSON on a worker);
- `responses`: response bodies, stream chunks and SSE frames, usage;
- `logprobs`: logprobs in the completions and the chat formats;
- `errors`: `APIError` and OpenAI's error JSON (``param`` names the field);
- `openapi`: the OpenAPI document of the routes;
- `event_stream`: the ASGI response that writes a stream's SSE frames and notices a client leaving.

The Ray plumbing that serves these (ingress, engine client, router, detok pool) lives in `deployments`.
"""
