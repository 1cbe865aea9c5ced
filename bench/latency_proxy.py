"""A TCP proxy that delays every chunk by a fixed time each way: a slow Kafka leader for the kill loop (issue 34).

The broker advertises the proxy's port (`start_broker(advertised_port=...)`), so every client reaches it through
the proxy: each produce request and each answer arrives `delay_s` late, bytes in order. A changelog batch then
waits longer for its acknowledgement and a hand-over to the producer takes longer than Faust's 0.1 s flush wait,
which is exactly where `Producer.flush()` stops being a barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class LatencyProxy:
    """127.0.0.1:`port` -> 127.0.0.1:`target_port`, every chunk `delay_s` late in each direction."""

    def __init__(self, port: int, target_port: int, delay_s: float) -> None:
        self.port, self.target_port, self.delay_s = port, target_port, delay_s
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:  # the broker is down (a restart): the client sees a closed connection, as it would
            writer.close()
            return
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.ensure_future(self._pipe(source, sink))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                sink.write(data)
                await sink.drain()

        delivery = asyncio.ensure_future(deliver())
        try:
            while data := await source.read(65536):
                await queue.put((time.monotonic() + self.delay_s, data))
            await queue.put((0.0, b""))
            await delivery
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            delivery.cancel()
            with contextlib.suppress(OSError):
                sink.close()
