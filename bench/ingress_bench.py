"""Ingress benchmark (not run by CI): signed `message_created` webhooks vs a raw aiokafka producer.

Starts `chatwoot-router ingress` as its own process against a real broker, then measures, in one run:

1. open loop at a fixed rate (default 500/s): latency p50/p99 of webhooks (HTTP in, acks=all out) and of a
   raw idempotent acks=all producer sending the same records at the same rate;
2. closed loop with N concurrent senders: the highest sustained webhooks/s and raw records/s.

The ratios (ingress/raw) are the figures worth tracking; absolute numbers depend on the machine. Each phase
also reports CPU: the ingress process's (utime + stime from /proc/<pid>/stat) per webhook, and this process's
per raw record while only the raw producer runs in it, and their ratio.

`--code-dir DIR` runs the ingress from another checkout (e.g. `git worktree add /tmp/before <commit>`), so a
change can be measured against the code before it in the same way:

    .venv/bin/python bench/ingress_bench.py --bootstrap 127.0.0.1:9092 [--rate 500] [--seconds 10] [--code-dir DIR]

`--secure` (issue 31 item 5) ignores `--bootstrap`: it starts a plaintext broker and a secured one (SASL_SSL,
`streams.kafka.local.start_broker(secure=True)`) in a temporary directory, an ingress on each (the secured one
under `ingress.properties`, after `config apply` as `admin`; the raw producer as the `ingress` user too), runs
the rounds of both sides alternately and prints both results and the secured/plaintext ratios:

    .venv/bin/python bench/ingress_bench.py --secure --rate 500 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, TCPConnector
from aiokafka import AIOKafkaProducer

from projections.acls import Role
from projections.webhook import sign
from schemas.records import WebhookReceived
from streams.kafka.local import LocalKafka, start_broker

SECRET = "bench-secret"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {"botIds": {"1": 10}, "accounts": {"1": {"team": {"assignee": 1, "covers": "All."}}}},
}


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time of a process (all threads) from /proc, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Cpu:
    """CPU seconds a process spends inside `with meter:` blocks, summed over blocks."""

    def __init__(self, pid: int | str) -> None:
        self.pid = pid
        self.spent = 0.0
        self._began = 0.0

    def __enter__(self) -> Cpu:
        self._began = cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.spent += cpu_seconds(self.pid) - self._began


def cpu_report(ingress: Cpu, webhooks: int, raw: Cpu, records: int) -> dict[str, float]:
    per_webhook = 1000 * ingress.spent / max(webhooks, 1)
    per_record = 1000 * raw.spent / max(records, 1)
    return {
        "ingress_cpu_ms_per_webhook": round(per_webhook, 3),
        "raw_cpu_ms_per_record": round(per_record, 3),
        "ratio_cpu": round(per_webhook / per_record, 2) if per_record else float("nan"),
    }


def webhook(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {
            "event": "message_created",
            "account": {"id": 1},
            "id": 100_000 + n,
            "conversation": {"id": 1 + n % 5000},
            "message_type": "incoming",
            "private": False,
            "content": "Hello, I have a question about my invoice.",
            "sender": {"id": 7, "name": "Bench Customer"},
        },
        separators=(",", ":"),
    ).encode()
    ts = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Chatwoot-Timestamp": ts,
        "X-Chatwoot-Signature": sign(SECRET, ts, body),
        "X-Chatwoot-Delivery": str(uuid.uuid4()),
    }
    return body, headers


def record(n: int) -> WebhookReceived:
    return WebhookReceived(
        at_ms=time.time_ns() // 1_000_000,
        account_id=1,
        conversation_id=1 + n % 5000,
        event="message_created",
        delivery_id=str(uuid.uuid4()),
    )


def percentiles(latencies: list[float]) -> dict[str, float]:
    if len(latencies) < 2:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_ms": round(cuts[49] * 1000, 2), "p99_ms": round(cuts[98] * 1000, 2)}


class Tally:
    """Latencies and errors of one kind of sender, accumulated over rounds."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.sent = 0
        self.elapsed = 0.0

    def summary(self) -> dict[str, Any]:
        per_s = round(self.sent / self.elapsed, 1) if self.elapsed else 0.0
        return {"sent": self.sent, "errors": self.errors, "per_s": per_s, **percentiles(self.latencies)}


async def open_loop(send: Callable[[int], Awaitable[bool]], rate: float, seconds: float, tally: Tally) -> None:
    """Start one send every 1/rate s regardless of responses; latency counts from the scheduled start."""
    total = int(rate * seconds)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(n: int, due: float) -> None:
        if await send(n):
            tally.latencies.append(loop.time() - due)
        else:
            tally.errors += 1

    tasks = []
    for n in range(total):
        due = start + n / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing of the load generator, not a wait for a result
        tasks.append(asyncio.create_task(one(tally.sent + n, due)))
    await asyncio.gather(*tasks)
    tally.sent += total
    tally.elapsed += loop.time() - start


async def closed_loop(send: Callable[[int], Awaitable[bool]], workers: int, seconds: float) -> dict[str, Any]:
    """`workers` senders back to back for `seconds`: the sustained throughput."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    done = errors = 0
    latencies: list[float] = []

    async def worker(w: int) -> None:
        nonlocal done, errors
        n = w
        while loop.time() < stop_at:
            started = loop.time()
            if await send(n):
                done += 1
                latencies.append(loop.time() - started)
            else:
                errors += 1
            n += workers

    started = loop.time()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    elapsed = loop.time() - started
    return {"done": done, "errors": errors, "per_s": round(done / elapsed, 1), **percentiles(latencies)}


async def start_ingress(
    bootstrap: str, app_id: str, workdir: Path, code_dir: Path | None = None, properties_dir: Path | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    """The ingress as a process; with `properties_dir` (a secured broker's), `config apply` as `admin` first
    (the `ingress` user may not create topics) and the ingress under `ingress.properties`."""
    config = workdir / "router.json"
    config.write_text(json.dumps(CONFIG), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        ROUTER_CONFIG=str(config),
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        ROUTER_APP_ID=app_id,
        CHATWOOT_TOKEN="t",
        CHATWOOT_AGENT_BOT_TOKENS='{"1":"b"}',
        CHATWOOT_AGENT_BOT_SECRETS=json.dumps({"1": SECRET}),
        TYPESAFE_API_KEY="k",
    )
    if properties_dir is not None:
        admin = {**env, "KAFKA_CLIENT_PROPERTIES": str(properties_dir / "admin.properties")}
        command = [sys.executable, "-m", "streams.cli", "config", "apply", str(config)]
        applied = subprocess.run(command, env=admin, cwd=code_dir, capture_output=True, text=True, check=False)
        if applied.returncode != 0:
            raise SystemExit(f"config apply failed: {applied.stdout}{applied.stderr}")
        env["KAFKA_CLIENT_PROPERTIES"] = str(properties_dir / "ingress.properties")
    if code_dir is not None:
        env["PYTHONPATH"] = str(code_dir)
    log = (workdir / "ingress.log").open("wb")
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
        cwd=code_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode().strip()
    if not line.startswith("ready url="):
        raise SystemExit(f"ingress did not start: {line!r}; see {workdir / 'ingress.log'}")
    return process, line.removeprefix("ready url=")


@dataclass
class Side:
    """One ingress with its broker and a raw producer to the same topic; its measurements, added up over rounds."""

    label: str
    process: asyncio.subprocess.Process
    url: str
    topic: str
    producer: AIOKafkaProducer
    session: ClientSession
    webhooks_open: Tally = field(default_factory=Tally)
    raw_open: Tally = field(default_factory=Tally)
    ingress_open: Cpu = field(init=False)
    raw_open_cpu: Cpu = field(default_factory=lambda: Cpu("self"))

    def __post_init__(self) -> None:
        self.ingress_open = Cpu(self.process.pid)

    async def send_webhook(self, n: int) -> bool:
        body, headers = webhook(n)
        async with self.session.post(self.url, data=body, headers=headers) as response:
            await response.read()
            return response.status == 200

    async def send_raw(self, n: int) -> bool:
        rec = record(n)
        await self.producer.send_and_wait(self.topic, rec.model_dump_json().encode(), key=rec.key.encode())
        return True

    async def close(self) -> None:
        await self.session.close()
        await self.producer.stop()
        self.process.terminate()
        await self.process.wait()


async def open_side(label: str, bootstrap: str, args: argparse.Namespace, kafka: LocalKafka | None = None) -> Side:
    """Start an ingress (under the `ingress` role when `kafka` is a secured broker) and a raw producer."""
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    properties_dir, options = None, {}
    if kafka is not None and kafka.secure is not None:
        await asyncio.to_thread(kafka.grant, app_id)  # it runs an event loop of its own
        properties_dir, options = kafka.properties_dir, kafka.secure.client_options(Role.INGRESS)
    workdir = Path(tempfile.mkdtemp(prefix=f"ingress-bench-{label}-"))
    process, base = await start_ingress(bootstrap, app_id, workdir, args.code_dir, properties_dir)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **options)
    await producer.start()
    session = ClientSession(connector=TCPConnector(limit=args.workers * 2))
    side = Side(label, process, f"{base}/chatwoot/agent-bot", f"{app_id}.conversations", producer, session)
    await closed_loop(side.send_webhook, 4, 1.0)  # warm up: connections, metadata, JIT of the broker
    await closed_loop(side.send_raw, 4, 1.0)
    return side


async def measure(sides: list[Side], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Open-loop rounds alternating sides and, within a side, webhooks and raw records (so that background load
    on a shared machine hits all alike); then each side's closed loops."""
    for _ in range(args.rounds):
        for side in sides:
            with side.ingress_open:
                await open_loop(side.send_webhook, args.rate, args.seconds / args.rounds, side.webhooks_open)
            with side.raw_open_cpu:
                await open_loop(side.send_raw, args.rate, args.seconds / args.rounds, side.raw_open)
    results: dict[str, dict[str, Any]] = {}
    for side in sides:
        ingress_max, raw_max_cpu = Cpu(side.process.pid), Cpu("self")
        with ingress_max:
            webhooks_max = await closed_loop(side.send_webhook, args.workers, args.seconds)
        with raw_max_cpu:
            raw_max = await closed_loop(side.send_raw, args.workers, args.seconds)
        result = {
            "code_dir": str(args.code_dir or Path(__file__).resolve().parents[1]),
            "open_loop_rate": args.rate,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "webhooks_open": side.webhooks_open.summary(),
            "raw_open": side.raw_open.summary(),
            "workers": args.workers,
            "webhooks_max": webhooks_max,
            "raw_max": raw_max,
            "cpu_open": cpu_report(side.ingress_open, side.webhooks_open.sent, side.raw_open_cpu, side.raw_open.sent),
            "cpu_max": cpu_report(ingress_max, webhooks_max["done"], raw_max_cpu, raw_max["done"]),
        }
        result["ratio_max_throughput"] = round(webhooks_max["per_s"] / raw_max["per_s"], 3)
        result["ratio_p99_open"] = round(result["webhooks_open"]["p99_ms"] / result["raw_open"]["p99_ms"], 2)
        results[side.label] = result
    return results


def tls_summary(plain: dict[str, Any], secured: dict[str, Any], rate: float) -> dict[str, Any]:
    """The figures issue 31 item 5 asks for, side by side, and the target (door p99 at the open-loop rate <= 50 ms)."""
    p99 = secured["webhooks_open"]["p99_ms"]
    return {
        "webhooks_per_s": {"plaintext": plain["webhooks_max"]["per_s"], "secured": secured["webhooks_max"]["per_s"]},
        f"p99_ms_at_{rate:g}_per_s": {"plaintext": plain["webhooks_open"]["p99_ms"], "secured": p99},
        "ratio_throughput": round(secured["webhooks_max"]["per_s"] / plain["webhooks_max"]["per_s"], 3),
        "ratio_p99_open": round(p99 / plain["webhooks_open"]["p99_ms"], 2),
        "target_p99_le_50ms_met": p99 <= 50,
    }


async def main(args: argparse.Namespace, brokers: dict[str, LocalKafka] | None = None) -> dict[str, Any]:
    """One side on `--bootstrap`, or (with `brokers`) one side per broker, measured alternately."""
    sides: list[Side] = []
    try:
        if brokers is None:
            sides.append(await open_side("plaintext", args.bootstrap, args))
            return (await measure(sides, args))["plaintext"]
        for label, broker in brokers.items():
            sides.append(await open_side(label, broker.bootstrap, args, broker))
        results: dict[str, Any] = await measure(sides, args)
        results["tls"] = tls_summary(results["plaintext"], results["secured"], args.rate)
        return results
    finally:
        for side in sides:
            await side.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """`main`, with a plaintext and a secured broker of its own under `--secure` (stopped at the end)."""
    if not args.secure:
        return asyncio.run(main(args))
    scratch = Path(tempfile.mkdtemp(prefix="ingress-bench-brokers-"))
    brokers: dict[str, LocalKafka] = {}
    try:
        brokers["plaintext"] = start_broker(data_dir=scratch / "plaintext")
        brokers["secured"] = start_broker(data_dir=scratch / "secured", secure=True)
        return asyncio.run(main(args, brokers))
    finally:
        for broker in brokers.values():
            broker.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop webhooks per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each measured phase")
    parser.add_argument("--rounds", type=int, default=5, help="alternating open-loop rounds per side")
    parser.add_argument("--workers", type=int, default=32, help="concurrent senders in the closed loop")
    parser.add_argument("--code-dir", type=Path, help="run the ingress from this checkout (default: this one)")
    parser.add_argument("--secure", action="store_true", help="plaintext vs SASL_SSL, on two brokers of its own")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse_args()), indent=2))
