"""The door survives broker restarts (issue 10): `chatwoot-router ingress` against a broker of its own that is
stopped (SIGTERM, and separately SIGKILL) and started again on the same port and data dir, several times, while
signed webhooks arrive at a steady rate.

Asserted, with deadlines and no sleeping for luck: every webhook answered 2xx is on the topic; every webhook is
answered 200 or 500 within Chatwoot's 5 s webhook timeout (behavior.md Decisions 6: a 500 Chatwoot retries, never a
timeout); while the broker is down webhooks get 500 and `/healthz` answers 503; once the broker is ready again the
door answers 200 and `/healthz` 200 by themselves; library log lines stay within the rate limit. How fast each
happens (the 500s, the 503, the first 200) is printed (`-s`), not asserted: the deadlines only catch a door that
hangs or never reopens.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import ClientSession, ClientTimeout

from handlers.logging_setup import LIBRARY_BURST, LIBRARY_INTERVAL_S
from projections.webhook import sign
from streams.kafka.local import LocalKafka, start_broker
from tests.support.env import router_env
from tests.support.kafka import read_topic

CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}
SECRET = "whsec-three"
RATE_S = 0.05  # a webhook every 50 ms
DOWN_DEADLINE_S = 30.0  # for the first 500 and /healthz 503 once the broker is gone (README: about a second)
REOPEN_DEADLINE_S = 120.0  # for the first 200 and /healthz 200 once the broker is back: catches a door that stays shut
PRODUCE_TIMEOUT_MS = 1000
CHATWOOT_TIMEOUT_S = 5.0  # every webhook is answered within Chatwoot's webhook timeout (behavior.md Decisions 6)
CYCLES = (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)


@dataclass
class Answer:
    delivery: str
    sent: float
    done: float
    status: int
    late: bool  # not answered within CHATWOOT_TIMEOUT_S


@dataclass
class Probe:
    at: float
    status: int


async def until(
    condition: Callable[[], object], timeout: float, what: str, detail: Callable[[], str] | None = None
) -> float:
    """Poll `condition` every 20 ms; returns when it holds, fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}" + (f" ({detail()})" if detail else ""))
        await asyncio.sleep(0.02)
    return time.monotonic()


class Traffic:
    """Signed webhooks at a steady rate (each its own request, like Chatwoot's workers) and /healthz polls."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answers: list[Answer] = []
        self.probes: list[Probe] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = True
        self._session = ClientSession(timeout=ClientTimeout(total=CHATWOOT_TIMEOUT_S))  # as Chatwoot's client

    async def close(self) -> None:
        self._running = False
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._session.close()

    def start(self) -> None:
        self._spawn(self._webhooks())
        self._spawn(self._healthz())

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _webhooks(self) -> None:
        n = 0
        next_at = time.monotonic()
        while self._running:
            n += 1
            self._spawn(self._post(f"d-{n}", n))
            next_at += RATE_S
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _post(self, delivery: str, n: int) -> None:
        body = json.dumps(
            {
                "event": "message_created",
                "account": {"id": 3},
                "id": n,
                "conversation": {"id": 1 + n % 7},
                "message_type": "incoming",
            }
        ).encode()
        ts = str(int(time.time()))
        headers = {
            "X-Chatwoot-Timestamp": ts,
            "X-Chatwoot-Signature": sign(SECRET, ts, body),
            "X-Chatwoot-Delivery": delivery,
        }
        sent = time.monotonic()
        request = asyncio.ensure_future(self._send(body, headers))
        answered, _ = await asyncio.wait([request], timeout=CHATWOOT_TIMEOUT_S)
        status = await request
        self.answers.append(Answer(delivery, sent, time.monotonic(), status, late=not answered))

    async def _send(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            async with self._session.post(f"{self.base}/chatwoot/agent-bot", data=body, headers=headers) as response:
                await response.read()
                return response.status
        except Exception:
            return 0  # no answer (timeout, reset): counted, and a failure of the door

    async def _healthz(self) -> None:
        while self._running:
            try:
                async with self._session.get(f"{self.base}/healthz") as response:
                    await response.read()
                    self.probes.append(Probe(time.monotonic(), response.status))
            except Exception:
                self.probes.append(Probe(time.monotonic(), 0))
            await asyncio.sleep(0.1)

    def answered(self, status: int, after: float) -> list[Answer]:
        return [a for a in self.answers if a.status == status and a.sent >= after]

    def since(self, after: float) -> str:
        answers = Counter(a.status for a in self.answers if a.sent >= after)
        probes = Counter(p.status for p in self.probes if p.at >= after)
        return f"answers {dict(answers)}, healthz {dict(probes)}, {len(self._tasks)} requests open"

    def health(self, status: int, after: float) -> list[Probe]:
        return [p for p in self.probes if p.status == status and p.at >= after]


def stop_broker(broker: LocalKafka, signum: signal.Signals) -> None:
    if signum == signal.SIGKILL:
        broker.kill()
    else:
        broker.stop()


async def outage_cycle(
    traffic: Traffic, broker: LocalKafka, signum: signal.Signals, data_dir: Path
) -> tuple[LocalKafka, str]:
    """Stop the broker with `signum` while webhooks flow, start it again on the same port and data dir; returns
    the new broker and a line of measurements."""
    since = time.monotonic()
    await until(lambda: len(traffic.answered(200, since)) >= 5, 30, "webhooks flowing (200)")
    stopped = time.monotonic()
    await asyncio.to_thread(stop_broker, broker, signum)
    down = time.monotonic()
    await until(
        lambda: traffic.answered(500, down),
        DOWN_DEADLINE_S,
        "a 500 while the broker is down",
        lambda: traffic.since(down),
    )
    await until(
        lambda: traffic.health(503, down), DOWN_DEADLINE_S, "/healthz 503 while down", lambda: traffic.since(down)
    )
    unhealthy = min(p.at for p in traffic.health(503, down)) - down
    broker = await asyncio.to_thread(start_broker, broker.port, data_dir)
    ready = time.monotonic()
    await until(
        lambda: traffic.answered(200, ready),
        REOPEN_DEADLINE_S,
        "a 200 after the broker is ready",
        lambda: traffic.since(ready),
    )
    first_200 = min(a.done for a in traffic.answered(200, ready))
    await until(lambda: traffic.health(200, ready), REOPEN_DEADLINE_S, "/healthz 200 after the broker is back")
    healthy = min(p.at for p in traffic.health(200, ready))
    refused = [a for a in traffic.answers if down <= a.sent < ready and a.status == 500]
    durations = sorted(a.done - a.sent for a in refused)
    line = (
        f"{signum.name}: broker away {ready - stopped:.1f} s; {len(refused)} webhooks got 500 "
        f"(median {durations[len(durations) // 2]:.3f} s, slowest {durations[-1]:.2f} s), /healthz 503 "
        f"{unhealthy:.2f} s after the stop; first 200 "
        f"{first_200 - ready:.2f} s and /healthz 200 {healthy - ready:.2f} s after the broker was ready"
    )
    late = [a.delivery for a in refused if a.late]
    assert not late, f"{len(late)} refused webhooks not answered within {CHATWOOT_TIMEOUT_S:g} s; {line}"
    return broker, line


@pytest.mark.kafka  # its own broker, stopped and started again
@pytest.mark.slow
async def test_door_reopens_by_itself_after_broker_restarts(tmp_path: Path, app_id: str) -> None:
    data_dir = tmp_path / "kafka"
    broker = await asyncio.to_thread(start_broker, None, data_dir)
    config = tmp_path / "router.json"
    config.write_text(json.dumps(CONFIG), encoding="utf-8")
    env = router_env(config, broker.bootstrap, app_id, ROUTER_PRODUCE_TIMEOUT_MS=str(PRODUCE_TIMEOUT_MS))
    log_path = tmp_path / "ingress.log"
    with log_path.open("wb") as log_file:
        ingress = await asyncio.create_subprocess_exec(
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
            stderr=log_file,
        )
    traffic: Traffic | None = None
    report: list[str] = []
    try:
        assert ingress.stdout is not None
        line = (await asyncio.wait_for(ingress.stdout.readline(), timeout=60)).decode().strip()
        assert line.startswith("ready url=http://127.0.0.1:"), line
        traffic = Traffic(line.removeprefix("ready url="))
        started = time.monotonic()
        traffic.start()
        for cycle, signum in enumerate(CYCLES, 1):
            broker, line = await outage_cycle(traffic, broker, signum, data_dir)
            report.append(f"cycle {cycle} {line}")
        since = time.monotonic()
        await until(lambda: len(traffic.answered(200, since)) >= 5, 30, "webhooks flowing after the last cycle")
        elapsed = time.monotonic() - started
        await traffic.close()
        statuses = Counter(a.status for a in traffic.answers)
        assert set(statuses) <= {200, 500}, statuses  # never a 4xx/503 or a timeout for a good webhook
        ok = {a.delivery for a in traffic.answers if a.status == 200}
        on_topic = {value["delivery_id"] for _, value in await read_topic(broker.bootstrap, f"{app_id}.conversations")}
        assert ok <= on_topic, f"acknowledged but not on the topic: {sorted(ok - on_topic)[:10]}"
        report.append(
            f"{len(traffic.answers)} webhooks in {elapsed:.0f} s: {dict(statuses)}; all {len(ok)} 2xx on the topic"
        )
    finally:
        if traffic is not None:
            await traffic.close()
        if ingress.returncode is None:
            ingress.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(ingress.wait(), 30)
            except TimeoutError:
                ingress.kill()
                await ingress.wait()
        await asyncio.to_thread(broker.stop)
    assert ingress.returncode == 0
    lines = log_path.read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines]
    library = Counter(e["logger"] for e in entries if not e["logger"].startswith("chatwoot_router"))
    windows = math.ceil(elapsed / LIBRARY_INTERVAL_S) + 2
    for logger, count in library.items():
        assert count <= (LIBRARY_BURST + 1) * windows, f"{logger}: {count} lines in {elapsed:.0f} s"
    report.append(f"ingress log: {len(lines)} lines ({sum(library.values())} from libraries: {dict(library)})")
    print("\n" + "\n".join(report))
