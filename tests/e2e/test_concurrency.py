"""64 concurrent streaming clients all finish, each with exactly its non-streaming twin's text."""

from __future__ import annotations

import asyncio

NUM_CLIENTS = 64
MAX_TOKENS = 16
TIMEOUT_S = 600


def _request(index: int, model: str) -> dict:
    prompt = f"Write a short sentence about the number {index}."
    sampling = {"temperature": 0.0} if index % 2 == 0 else {"temperature": 1.0, "seed": index}
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, **sampling}


async def _stream(client, body: dict) -> tuple[str, str]:
    text, finish = "", None
    async for chunk in await client.completions.create(stream=True, **body):
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish


def test_64_concurrent_streams_match_their_twins(server):
    async def run() -> tuple[list, list]:
        client = server.async_openai()
        bodies = [_request(i, server.model) for i in range(NUM_CLIENTS)]
        streamed = await asyncio.wait_for(asyncio.gather(*(_stream(client, b) for b in bodies)), TIMEOUT_S)
        twins = await asyncio.gather(*(client.completions.create(**b) for b in bodies))
        await client.close()
        return streamed, twins

    streamed, twins = asyncio.run(run())
    for index, ((text, finish), twin) in enumerate(zip(streamed, twins)):
        assert finish == twin.choices[0].finish_reason, index
        assert text == twin.choices[0].text, index
