"""Logprobs in both OpenAI formats, streamed and not."""

from __future__ import annotations

import math

PROMPT = "The capital of France is"


def test_completion_logprobs(server):
    client = server.openai()
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0.0, logprobs=3)
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == full.usage.completion_tokens
    assert "".join(lp.tokens) == full.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and logprob <= 0
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-4)  # greedy: the sampled token is the top one
        assert token in top
    streamed = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0.0, logprobs=3, stream=True))
    tokens = [t for chunk in streamed for c in chunk.choices if c.logprobs for t in c.logprobs.tokens]
    assert tokens == lp.tokens


def test_chat_logprobs(server):
    client = server.openai()
    messages = [{"role": "user", "content": "Say hello in French."}]
    full = client.chat.completions.create(model=server.model, messages=messages, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == full.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    streamed = list(
        client.chat.completions.create(model=server.model, messages=messages, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2, stream=True)
    )
    tokens = [e.token for chunk in streamed for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert tokens == [entry.token for entry in content]
