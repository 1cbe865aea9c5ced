"""Worker idle benchmark (not run by CI): does holding 10,000 durable timers cost an idle worker CPU?

DESIGN §7 claims the timer scan costs what is due, not the number of conversations: the worker keeps its
owned partitions' due times in a heap (`projections.worker.timer_index`) and its once-a-second tick pops only what is
due. This measures the claim end to end on the real stack of the end-to-end tests (sandbox, ingress, one
worker, one broker):

1. idle window with no conversations: the worker process's CPU seconds (utime + stime from /proc, every
   thread, RocksDB's included) over `--window` seconds;
2. N conversations are made to hold a far-future timer the honest way, through the worker's normal path: the
   sandbox fails every `get_conversation` with a 500, each conversation gets a real signed webhook, the
   route run's first command fails and the job backs off (ROUTER_RETRY_BASE_MS=3,600,000, so the first
   retry is capped at 30 minutes: nothing comes due while we measure);
3. once `router_timers_pending` shows N timers and the worker has caught up, the same idle windows again.

Sweeps are pushed out (ROUTER_SWEEP_INTERVAL_S=3600) so that the leader's sweep does not page through the N
pending conversations inside a window. Reported: idle CPU % of one core before and after, and the ratio.
Also printed: the pure cost of one `TimerIndex.pop_due` with nothing due, empty and with N entries.

    .venv/bin/python bench/worker_idle_bench.py --bootstrap 127.0.0.1:9092 [--conversations 10000] [--window 30]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import timeit
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker_bench import QUESTION, cpu_seconds

from projections.worker.timer_index import TimerIndex
from tests.support.stack import INBOX_1, Stack
from tests.support.waiting import wait_until

FAR_RETRY_BASE_MS = 3_600_000  # first backoff = min(base, 30 min cap)
SETTLE_S = 10.0


def metric(text: str, name: str) -> float:
    """Sum of every sample of `name` in a Prometheus text exposition (0 when absent)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def idle_cpu(pid: int, window_s: float) -> float:
    """Share of one core the process used over `window_s` seconds in which nothing is sent to it."""
    began_cpu, began = cpu_seconds(pid), time.monotonic()
    time.sleep(window_s)  # the measurement window itself: the process is left alone for exactly this long
    return (cpu_seconds(pid) - began_cpu) / (time.monotonic() - began)


async def make_backing_off(sandbox_url: str, count: int, concurrency: int) -> None:
    """`count` new conversations in account 1, each with one incoming message (so one signed webhook)."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=f"{sandbox_url}/_sandbox", timeout=30) as http:

        async def one() -> None:
            async with limit:
                created = await http.post("/conversations", json={"account_id": 1, "inbox_id": INBOX_1})
                created.raise_for_status()
                said = await http.post(f"/conversations/1/{created.json()['id']}/incoming", json={"content": QUESTION})
                said.raise_for_status()

        await asyncio.gather(*(one() for _ in range(count)))


def pop_due_cost(entries: int, repeat: int = 2000) -> float:
    """Seconds per `pop_due` call when nothing is due, with `entries` far-future timers over 4 partitions."""
    index = TimerIndex()
    for n in range(entries):
        index.set(n % 4, f"1:{n}", 10**13)
    partitions = frozenset(range(4))
    return timeit.timeit(lambda: index.pop_due(1_000, partitions), number=repeat) / repeat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per idle measurement window")
    parser.add_argument("--windows", type=int, default=2, help="idle windows before and after")
    parser.add_argument("--concurrency", type=int, default=16, help="parallel requests creating conversations")
    parser.add_argument("--keep", help="keep the processes' logs and state in this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        stack = Stack(args.bootstrap, f"bench-idle-{int(time.time())}", tmp)
        # the processes share this dict: change it before they start
        stack.env.update(ROUTER_RETRY_BASE_MS=str(FAR_RETRY_BASE_MS), ROUTER_SWEEP_INTERVAL_S="3600")
        stack.start()
        try:
            assert stack.worker.popen is not None
            pid = stack.worker.popen.pid
            time.sleep(SETTLE_S)  # let the start-up sweep and the first commits finish before measuring
            before = [idle_cpu(pid, args.window) for _ in range(args.windows)]
            print(
                f"idle, {metric(stack.metrics(), 'router_timers_pending'):.0f} timers: "
                + ", ".join(f"{100 * b:.2f} %" for b in before),
                flush=True,
            )

            stack.fault(op="get_conversation", mode="fail", status=500, times=None)
            started_cpu, started = cpu_seconds(pid), time.monotonic()
            asyncio.run(make_backing_off(stack.sandbox_url, args.conversations, args.concurrency))
            posted = time.monotonic() - started

            def all_backing_off() -> bool:
                text = stack.metrics()
                return (
                    metric(text, "router_timers_pending") >= args.conversations
                    and metric(text, "router_consumer_lag") == 0
                )

            wait_until("every conversation to back off", all_backing_off, 600, 2.0)
            loaded = time.monotonic() - started
            load_cpu = cpu_seconds(pid) - started_cpu
            text = stack.metrics()
            print(
                f"{args.conversations} conversations posted in {posted:.0f} s, all backing off after {loaded:.0f} s "
                f"(worker CPU {load_cpu:.0f} s; timers pending {metric(text, 'router_timers_pending'):.0f}, "
                f"retries {metric(text, 'router_turn_outcomes_total'):.0f})",
                flush=True,
            )
            time.sleep(SETTLE_S)  # let the last commits and RocksDB flushes pass
            fired_before = metric(stack.metrics(), "router_timers_fired_total")
            after = [idle_cpu(pid, args.window) for _ in range(args.windows)]
            fired_after = metric(stack.metrics(), "router_timers_fired_total")
            print(
                f"idle, {metric(stack.metrics(), 'router_timers_pending'):.0f} timers: "
                + ", ".join(f"{100 * a:.2f} %" for a in after)
                + f" (timers fired during the windows: {fired_after - fired_before:.0f})",
                flush=True,
            )
            ratio = (sum(after) / len(after)) / (sum(before) / len(before))
            print(f"idle CPU after / before: x{ratio:.2f}")
        finally:
            stack.stop()
    empty, full = pop_due_cost(0), pop_due_cost(args.conversations)
    print(
        f"TimerIndex.pop_due, nothing due: {1e6 * empty:.1f} µs empty, {1e6 * full:.1f} µs with "
        f"{args.conversations} entries"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
