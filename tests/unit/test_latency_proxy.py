"""The kill loop's slow broker (bench/latency_proxy.py): bytes arrive late but whole and in order, both ways."""

from __future__ import annotations

import asyncio

from bench.latency_proxy import LatencyProxy
from streams.kafka.ports import free_port


async def test_every_byte_arrives_in_order_both_ways() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = LatencyProxy(free_port(), target.sockets[0].getsockname()[1], delay_s=0.02)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        sent = b"".join(f"{n:05d}".encode() for n in range(2000))
        for start in range(0, len(sent), 700):
            writer.write(sent[start : start + 700])
        await writer.drain()
        async with asyncio.timeout(30):
            received = await reader.readexactly(len(sent))
        assert received == sent
        writer.close()
    finally:
        await proxy.stop()
        target.close()


async def test_a_client_of_a_broker_that_is_down_sees_the_connection_closed() -> None:
    proxy = LatencyProxy(free_port(), free_port(), delay_s=0.01)  # nothing listens on the target port
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        async with asyncio.timeout(30):
            assert await reader.read(10) == b""
        writer.close()
    finally:
        await proxy.stop()
