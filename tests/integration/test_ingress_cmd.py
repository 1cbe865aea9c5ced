"""`chatwoot-router ingress` as an operator runs it: refuses bad configuration, serves, stops cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from projections.webhook import sign
from tests.support.env import router_env
from tests.support.kafka import read_topic

CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}


def environment(config: Path, bootstrap: str, app_id: str, **extra: str) -> dict[str, str]:
    return router_env(config, bootstrap, app_id, **extra)


def write_config(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


async def test_invalid_configuration_refuses_to_start_with_the_key_path(tmp_path: Path, app_id: str) -> None:
    bad = json.loads(json.dumps(CONFIG))
    bad["routing"]["minConfidence"] = 0.2
    env = environment(write_config(tmp_path, bad), "127.0.0.1:1", app_id)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streams.cli", "ingress", "--port", "0", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 2
    assert "routing.minConfidence" in stderr.decode()


async def test_serves_webhooks_into_kafka_and_stops_on_sigterm(
    tmp_path: Path, kafka_bootstrap: str, app_id: str
) -> None:
    env = environment(write_config(tmp_path, CONFIG), kafka_bootstrap, app_id)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        "ingress",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode().strip()
        assert line.startswith("ready url=http://127.0.0.1:")
        base = line.removeprefix("ready url=")
        body = json.dumps(
            {
                "event": "message_created",
                "account": {"id": 3},
                "id": 1,
                "conversation": {"id": 55},
                "message_type": "incoming",
                "content": "secret plans",
            }
        ).encode()
        ts = str(int(time.time()))
        headers = {
            "X-Chatwoot-Timestamp": ts,
            "X-Chatwoot-Signature": sign("whsec-three", ts, body),
            "X-Chatwoot-Delivery": "cmd-1",
        }
        async with ClientSession() as session:
            async with session.get(f"{base}/healthz") as response:
                assert (response.status, await response.json()) == (200, {"ok": True, "kafka": True})
            async with session.post(f"{base}/chatwoot/agent-bot", data=body, headers=headers) as response:
                assert (response.status, await response.text()) == (200, '{"ok":true}')
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
        assert process.returncode == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    records = await read_topic(kafka_bootstrap, f"{app_id}.conversations")
    assert [(key, value["delivery_id"]) for key, value in records] == [("3:55", "cmd-1")]
    logs = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    messages = [entry["message"] for entry in logs]
    assert "ingress stopped" in messages and "webhook" in messages
    assert "secret plans" not in stderr.decode() and "whsec-three" not in stderr.decode()
