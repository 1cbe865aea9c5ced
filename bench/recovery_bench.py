"""Recovery and door latency under broker faults, measured and printed, never asserted (issue 33 item 2; not run by CI).

The tests assert only what a user would notice, with deadlines that catch a hang (a worker or a door that never
comes back); the figures they used to assert are measured here instead:

- `restart`: the stack (sandbox, ingress, one worker) on a single local broker of its own, as in
  `tests/e2e/test_worker_broker_restart_e2e.py`; the broker is stopped (SIGTERM), then killed (SIGKILL), and
  started again on the same port and data dir, `--rounds` times each. Per restart: seconds from the broker
  serving again to the worker's `/healthz` 200 and to a new conversation routed to its end. The issue's target
  was /healthz 200 within 5 s (the test asserted it until issue 33).
- `cluster`: `chatwoot-router ingress` alone on a three-node cluster (`streams.kafka.cluster`, replication 3, min
  ISR 2), signed webhooks sent straight to it at `--rate` a second (each with Chatwoot's 5 s timeout) and its
  `/healthz` sampled every 0.2 s, through three phases: the node leading most partitions killed and brought
  back 20 s later; one node away (stopped) for `--away` seconds; then a second node killed (two of three down).
  Per phase: answers by status, answer times (p50, p99, max) of the 200s and the 500s, the longest run of 500s
  and the `/healthz` samples by status. `tests/e2e/test_cluster_e2e.py` asserted that every sample was 200 with
  one node away and that each 500 with two nodes down came within 1.5 s; it now asserts Chatwoot's 5 s and that
  no webhook is given up while its partition is writable.

    .venv/bin/python bench/recovery_bench.py [--scenario all|restart|cluster] [--rounds 1] [--rate 20]
        [--away 15] [--json FILE] [--work-dir DIR]

It starts its own brokers (never `KAFKA_BOOTSTRAP_SERVERS`), on free ports, under `--work-dir` (default: a
temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from projections.webhook import sign
from streams.kafka.cluster import LocalCluster, start_cluster
from streams.kafka.local import start_broker
from streams.kafka.ports import free_port
from tests.support.cluster import HealthSampler
from tests.support.env import router_env
from tests.support.processes import Process
from tests.support.stack import Stack
from tests.support.waiting import wait_until

BILLING = "I was charged twice on my invoice, please refund the payment"
CHATWOOT_TIMEOUT_S = 5.0
LEADER_DOWN_S = 20.0  # how long the killed leader stays away, as in the cluster test
PARTITIONS = 6
CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:9"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}
SECRET = "whsec-three"  # account 3's, in tests/support/env.py's router_env


# --- restart: a worker and its only broker ------------------------------------------------------------------


def routed(stack: Stack, conversation: int) -> bool:
    found = stack.conversation(1, conversation)
    return found["status"] != "pending" and found.get("bot_assignee_id") is None


def restart_scenario(work: Path, rounds: int) -> list[dict[str, Any]]:
    data_dir = work / "restart-kafka"
    broker = start_broker(None, data_dir)
    (work / "restart").mkdir(parents=True, exist_ok=True)
    stack = Stack(broker.bootstrap, f"recovery-{os.getpid()}-{int(time.time())}", work / "restart")
    results: list[dict[str, Any]] = []
    try:
        stack.start()
        first = stack.new_conversation()
        stack.customer_says(1, first, BILLING)
        wait_until("a first conversation routed", lambda: routed(stack, first), 120, 0.2)
        for _ in range(rounds):
            for how in (signal.SIGTERM, signal.SIGKILL):
                if how == signal.SIGTERM:
                    broker.stop()
                else:
                    broker.kill()
                wait_until("/healthz not 200 while away", lambda: stack.healthz().status_code != 200, 60, 0.1)
                broker = start_broker(broker.port, data_dir)
                ready = time.monotonic()
                wait_until("/healthz 200", lambda: stack.healthz().status_code == 200, 120, 0.05)
                healthy_s = time.monotonic() - ready
                conversation = stack.new_conversation()
                stack.customer_says(1, conversation, BILLING)
                wait_until("routed", lambda c=conversation: routed(stack, c), 120, 0.05)  # type: ignore[misc]
                routed_s = time.monotonic() - ready
                result = {"how": how.name, "healthz_200_s": round(healthy_s, 2), "routed_s": round(routed_s, 2)}
                results.append(result)
                print(
                    f"restart {how.name}: /healthz 200 {healthy_s:.2f} s, a new conversation routed {routed_s:.2f} s "
                    "after the broker served again",
                    flush=True,
                )
    finally:
        stack.stop()
        broker.stop()
    return results


# --- cluster: the door's answers during leader kills and nodes away --------------------------------------------


@dataclass
class Answer:
    at: float  # wall clock of the answer
    seconds: float
    status: int  # 0: no answer within Chatwoot's 5 s


@dataclass
class Sender:
    """Signed webhooks at a steady rate, each its own request (its own thread), answers recorded."""

    url: str
    rate: float
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        pacer = threading.Thread(target=self._pace, daemon=True)
        pacer.start()
        self._threads.append(pacer)

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(CHATWOOT_TIMEOUT_S + 5)

    def _pace(self) -> None:
        n, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            n += 1
            sender = threading.Thread(target=self._post, args=(n,), daemon=True)
            sender.start()
            self._threads.append(sender)
            next_at += 1 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))  # the sending rate itself

    def _post(self, n: int) -> None:
        body = json.dumps(
            {
                "event": "message_created",
                "account": {"id": 3},
                "id": n,
                "conversation": {"id": 1 + n % 60},
                "message_type": "incoming",
            }
        ).encode()
        ts = str(int(time.time()))
        headers = {"X-Chatwoot-Timestamp": ts, "X-Chatwoot-Signature": sign(SECRET, ts, body)}
        headers["X-Chatwoot-Delivery"] = f"bench-{n}"
        sent = time.monotonic()
        try:
            status = httpx.post(self.url, content=body, headers=headers, timeout=CHATWOOT_TIMEOUT_S).status_code
        except httpx.HTTPError:
            status = 0
        self.answers.append(Answer(time.time(), time.monotonic() - sent, status))

    def accepted_since(self, since: float) -> int:
        return sum(1 for a in list(self.answers) if a.at >= since and a.status == 200)


def quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values):.3f} s, p99 {p99:.3f} s, max {values[-1]:.3f} s"


def longest_500_run(answers: list[Answer]) -> tuple[int, float]:
    best, best_s, run, start = 0, 0.0, 0, 0.0
    for answer in sorted(answers, key=lambda a: a.at):
        if answer.status == 200:
            run = 0
            continue
        start = answer.at if run == 0 else start
        run += 1
        if run > best:
            best, best_s = run, answer.at - start
    return best, best_s


def phase(name: str, sender: Sender, health: HealthSampler, start: float, end: float) -> dict[str, Any]:
    answers = [a for a in list(sender.answers) if start <= a.at <= end]
    samples = Counter(status for at, status in list(health.samples) if start <= at <= end)
    statuses = Counter(a.status for a in answers)
    run, run_s = longest_500_run(answers)
    ok = [a.seconds for a in answers if a.status == 200]
    refused = [a.seconds for a in answers if a.status == 500]
    print(
        f"{name} ({end - start:.0f} s): answers {dict(sorted(statuses.items()))}; 200s {quantiles(ok)}; "
        f"500s {quantiles(refused)}; longest run of refusals {run} ({run_s:.1f} s); "
        f"/healthz samples {dict(sorted(samples.items()))}",
        flush=True,
    )
    return {
        "phase": name,
        "seconds": round(end - start, 1),
        "answers": dict(statuses),
        "ok_seconds": sorted(ok),
        "refused_seconds": sorted(refused),
        "longest_refused_run": [run, round(run_s, 2)],
        "healthz": dict(samples),
    }


def most_leading(cluster: LocalCluster, topic: str) -> int:
    leaders = Counter(cluster.leaders(topic).values())
    return cluster.index_of(leaders.most_common(1)[0][0])


def cluster_scenario(work: Path, rate: float, away_s: float) -> list[dict[str, Any]]:
    cluster = start_cluster(None, work / "cluster")
    app_id = f"recovery-{os.getpid()}-{int(time.time())}"
    topic = f"{app_id}.conversations"
    config = work / "router.json"
    config.write_text(json.dumps(CONFIG))
    port = free_port()
    env = router_env(config, cluster.bootstrap, app_id, ROUTER_PARTITIONS=str(PARTITIONS))
    ingress = Process("ingress", ["ingress", "--host", "127.0.0.1", "--port", str(port)], env, work)
    base = f"http://127.0.0.1:{port}"
    results: list[dict[str, Any]] = []
    sender = Sender(f"{base}/chatwoot/agent-bot", rate)
    try:
        ingress.start()
        wait_until("the ingress healthy", lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, 120)
        cluster.wait_in_sync(120)
        with HealthSampler(f"{base}/healthz") as health:
            sender.start()
            began = time.time()
            wait_until("webhooks flowing", lambda: sender.accepted_since(began) >= 40, 60)

            # the leader of most partitions killed, back 20 s later
            index = most_leading(cluster, topic)
            down = time.time()
            cluster.kill(index)
            time.sleep(LEADER_DOWN_S)  # the scenario: the node stays away 20 s
            cluster.restart(index)
            cluster.wait_in_sync(120)
            time.sleep(5)  # a few seconds of traffic after the node's return belong to the phase
            results.append(phase("leader killed, back 20 s later", sender, health, down, time.time()))

            # one node of three away
            index = most_leading(cluster, topic)
            gone = cluster.nodes[index].node_id
            one_down = time.time()
            cluster.terminate(index)
            wait_until(
                f"node {gone} out of every in-sync set",
                lambda: all(gone not in p["isr"] for p in cluster.describe_partitions() if p["topic"] == topic),
                60,
                0.2,
            )
            fenced = time.time()
            time.sleep(away_s)  # the scenario: a while of traffic with one node away
            results.append(phase("one node away (from the stop)", sender, health, one_down, time.time()))
            results.append(phase("one node away (from its fencing)", sender, health, fenced, time.time()))

            # a second node killed: two of three down
            second = next(i for i, node in enumerate(cluster.nodes) if node.alive())
            two_down = time.time()
            cluster.kill(second)
            time.sleep(10)  # the scenario: ten seconds with two nodes of three down
            results.append(phase("two nodes of three down", sender, health, two_down, time.time()))
            cluster.restart(second)
            returned = time.time()
            wait_until("a 200 after a node came back", lambda: sender.accepted_since(returned) >= 1, 120)
            print(f"door open again {time.time() - returned:.1f} s after a second node served again", flush=True)
            cluster.restart(index)
            cluster.wait_in_sync(120)
            sender.stop()
    finally:
        sender.stop()
        ingress.stop()
        cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["all", "restart", "cluster"], default="all")
    parser.add_argument("--rounds", type=int, default=1, help="restart: SIGTERM and SIGKILL restarts, each this often")
    parser.add_argument("--rate", type=float, default=20.0, help="cluster: webhooks a second")
    parser.add_argument("--away", type=float, default=15.0, help="cluster: seconds with one node away once fenced")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--work-dir", type=Path, help="keep the brokers' data and the logs here")
    args = parser.parse_args()
    temporary = None if args.work_dir else tempfile.TemporaryDirectory(prefix="recovery-bench-")
    work = args.work_dir or Path(temporary.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    try:
        if args.scenario in ("all", "restart"):
            report["restart"] = restart_scenario(work, args.rounds)
        if args.scenario in ("all", "cluster"):
            report["cluster"] = cluster_scenario(work, args.rate, args.away)
    finally:
        if temporary is not None:
            temporary.cleanup()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
