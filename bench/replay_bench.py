"""Replay benchmark (not run by CI): reading and folding the event log against a raw consumer (DESIGN §8).

Builds a `conversations` topic of at least `--records` records by replicating the recorded demo histories
(`tests/golden/demo`, every conversation renamed to a new id), then in the same run, alternating:

- raw: an aiokafka consumer reads the whole topic (records/s);
- replay: `audit`'s replay (`handlers.kafka.topic_io.read_topic` + `projections.logs.audit.LogReplay`) reads
  and folds it.

Reported: each rate and the ratio replay/raw (DESIGN §8 asks ≥ 0.5).

    .venv/bin/python bench/replay_bench.py [--bootstrap HOST:PORT] [--records 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handlers.kafka.topic_io import read_topic, topic_partitions
from handlers.kafka.topics import ensure_topics
from projections.logs.audit import LogReplay
from tests.golden.histories import demo_logs, renamed, settings_of

PARTITIONS = 4


async def fill(bootstrap: str, topic: str, wanted: int) -> int:
    await ensure_topics(bootstrap, {topic: PARTITIONS})
    logs = demo_logs()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    written, new_id = 0, 1000
    try:
        while written < wanted:
            for old, records in logs:
                new_id += 1
                key = f"1:{new_id}".encode()
                for record in records:
                    await producer.send(topic, key=key, value=renamed(record, old, new_id).encode())
                    written += 1
        await producer.flush()
    finally:
        await producer.stop()
    return written


async def raw_rate(bootstrap: str, topic: str) -> float:
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        started, count = time.perf_counter(), 0
        remaining: set[TopicPartition] = {tp for tp, end in ends.items() if end > 0}
        while remaining:
            for tp, records in (await consumer.getmany(*remaining, timeout_ms=500)).items():
                count += len(records)
                if records and records[-1].offset >= ends[tp] - 1:
                    remaining.discard(tp)
        return count / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def replay_rate(bootstrap: str, topic: str) -> tuple[float, int]:
    config, retry_base_ms = settings_of(Path(__file__).resolve().parents[1] / "tests" / "golden" / "demo")
    replay = LogReplay(config, retry_base_ms=retry_base_ms)
    started = time.perf_counter()
    count = await read_topic(bootstrap, topic, lambda r: replay.feed(r.value, r.offset, r.partition))
    return count / (time.perf_counter() - started), replay.undecodable


async def main(args: argparse.Namespace) -> None:
    bootstrap = args.bootstrap
    topic = f"bench-replay-{uuid.uuid4().hex[:8]}.conversations"
    written = await fill(bootstrap, topic, args.records)
    print(f"topic {topic}: {written} records")
    raws, replays = [], []
    for round_ in range(1, args.rounds + 1):
        raw = await raw_rate(bootstrap, topic)
        replayed, undecodable = await replay_rate(bootstrap, topic)
        assert undecodable == 0, f"{undecodable} records did not decode"
        raws.append(raw)
        replays.append(replayed)
        print(f"round {round_}: raw {raw:,.0f} records/s, replay {replayed:,.0f} records/s, ratio {replayed / raw:.2f}")
    ratio = statistics.median(r / w for r, w in zip(replays, raws, strict=True))
    print(
        f"median: raw {statistics.median(raws):,.0f}/s, replay {statistics.median(replays):,.0f}/s, "
        f"ratio replay/raw {ratio:.2f}"
    )


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=None, help="a running broker (default: start a local one)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main(args))
        return
    from streams.kafka.local import running_broker

    with running_broker(data_dir=Path(f"/tmp/replay-bench-{uuid.uuid4().hex[:6]}")) as broker:
        args.bootstrap = broker.bootstrap
        asyncio.run(main(args))


if __name__ == "__main__":
    run()
