"""A minimal Faust app with a RocksDB table, run as a worker subprocess by the recovery tests.

It folds `<app>.events` into the table `totals` (count and last value per key), skipping events it has already
applied (by offset) as DESIGN §5 requires, and serves the table at `GET /table` so the test can read it.
Configuration comes from PROBE_* environment variables.
"""

from __future__ import annotations

import os
from typing import Any

import faust
from faust.web import Request, Response, View

app = faust.App(
    os.environ["PROBE_APP_ID"],
    broker=f"kafka://{os.environ['PROBE_BOOTSTRAP']}",
    store="rocksdb://",
    datadir=os.environ["PROBE_DATA_DIR"],
    topic_partitions=4,
    topic_replication_factor=1,
    web_host="127.0.0.1",
    web_port=int(os.environ["PROBE_WEB_PORT"]),
    web_in_thread=False,
    processing_guarantee="at_least_once",
    broker_commit_every=1,
)
events = app.topic(f"{os.environ['PROBE_APP_ID']}.events", key_serializer="raw", value_serializer="raw", partitions=4)
totals = app.Table("totals", partitions=4)


@app.agent(events)
async def fold(stream: Any) -> None:
    async for event in stream.events():
        key = event.key.decode()
        current = totals.get(key) or {"count": 0, "last": None, "offset": -1}
        if event.message.offset <= current["offset"]:
            continue
        totals[key] = {"count": current["count"] + 1, "last": event.value.decode(), "offset": event.message.offset}


@app.page("/table")
class TableView(View):
    async def get(self, request: Request) -> Response:
        return self.json({key: value for key, value in totals.items()})


@app.page("/ready")
class ReadyView(View):
    async def get(self, request: Request) -> Response:
        recovered = app.tables.recovery.completed.is_set()
        return self.json({"ready": recovered}, status=200 if recovered else 503)


if __name__ == "__main__":
    app.main()
