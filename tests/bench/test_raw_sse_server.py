"""`bench.lib.raw_sse_server.Streams`: each stream gets the head with its first frame, its frames in order,
then the last frame and the chunked body's end, whether the step writes them or a task per stream does."""

from __future__ import annotations

import asyncio

import pytest

from bench.lib.raw_sse_server import END, HEAD, Streams, chunk


class Transport:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


EXPECTED = HEAD + chunk(b"f") * 2 + chunk(b"last") + END


@pytest.mark.parametrize("mode", ["step", "task"])
def test_each_stream_gets_its_frames_in_order_then_the_end(mode):
    async def main() -> list[Transport]:
        streams = Streams(mode, b"f", b"last", 3)
        transports = [Transport(), Transport()]
        tasks = []
        for transport in transports:
            if mode == "step":
                streams.sent[transport] = 0  # type: ignore[index]
            else:
                tasks.append(asyncio.get_running_loop().create_task(streams.stream(transport)))  # type: ignore[arg-type]
        for _ in range(4):  # one step more than frames: nothing more is written
            await asyncio.sleep(0)
            streams.step()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert not streams.sent and not streams.wakeups
        return transports

    assert [t.data for t in asyncio.run(main())] == [EXPECTED, EXPECTED]
