"""Reads and writes `<app>.configs` and the `ConfigApplied` markers (DESIGN §8 "Configuration is an event").

`apply` stores the document under its version on the compacted, single-partition `configs` topic, then writes a
marker into every partition of `conversations` and `sweeps` (acks=all, idempotent producer), so every
partition switches at an offset the log records. `read_book` reads the documents back in the order applied.
"""

from __future__ import annotations

import time

from handlers.kafka.topic_io import durable_producer, read_topic, topic_partitions
from handlers.kafka.topics import ensure_topics
from schemas.configs import ConfigBook, ConfigDocument
from schemas.records import MARKER_KEY, ConfigApplied

COMPACTED = {"cleanup.policy": "compact"}


def configs_topic(app_id: str) -> str:
    return f"{app_id}.configs"


async def ensure_configs_topic(bootstrap: str, app_id: str) -> None:
    topic = configs_topic(app_id)
    await ensure_topics(bootstrap, {topic: 1}, configs={topic: COMPACTED})


async def read_book(bootstrap: str, app_id: str) -> ConfigBook:
    """Every document applied so far; an empty book when nothing was ever applied (or the topic is missing)."""
    documents: list[tuple[int, ConfigDocument]] = []

    def keep(record: object) -> None:
        value = getattr(record, "value", None)
        if value:
            documents.append((getattr(record, "offset", 0), ConfigDocument.model_validate_json(value)))

    try:
        await read_topic(bootstrap, configs_topic(app_id), keep)
    except LookupError:
        return ConfigBook()
    documents.sort(key=lambda pair: pair[0])
    return ConfigBook([document for _, document in documents])


async def apply(bootstrap: str, app_id: str, document: ConfigDocument) -> int:
    """Store `document` and mark every partition of `conversations` and `sweeps`; returns the markers written."""
    await ensure_configs_topic(bootstrap, app_id)
    targets = []
    for name in ("conversations", "sweeps"):
        targets.extend(await topic_partitions(bootstrap, f"{app_id}.{name}"))
    now = time.time_ns() // 1_000_000
    stored = document.model_copy(update={"applied_at_ms": document.applied_at_ms or now})
    marker = ConfigApplied(version=document.version, at_ms=now).model_dump_json().encode()
    async with durable_producer(bootstrap) as producer:
        await producer.send_and_wait(
            configs_topic(app_id), key=document.version.encode(), value=stored.model_dump_json().encode()
        )
        for tp in targets:
            await producer.send_and_wait(tp.topic, key=MARKER_KEY.encode(), value=marker, partition=tp.partition)
    return len(targets)
