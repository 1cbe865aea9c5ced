"""The kill-loop test (issue 15): the whole router under SIGKILLs, Chatwoot faults, people and broker restarts.

    .venv/bin/python -m bench.chaos --conversations 200 --kills 100 --seed 7 [--workers 2] [--partitions 8]
        [--broker-restarts 3] [--pauses 12] [--pause-in-recovery] [--duration 420] [--fault-rate 0.3] [--realistic]
        [--secure] [--json FILE]
        [--forget-rate 0.1] [--work-dir DIR]

It starts its own local Kafka broker (or uses `KAFKA_BOOTSTRAP_SERVERS`; broker restarts need its own), the
sandbox (a simulated Chatwoot and System One), one ingress and `--workers` workers with the same app id, each
with its own RocksDB directory, on topics of `--partitions` partitions. Then, over `--duration` seconds (default
1.5 s per conversation), it plays the conversations of a seeded plan:

- kinds: a billing or a sales question (assigned to its confident owner), an opening-hours question (canned
  reply, then resolved), spam (resolved), a newsletter (snoozed), something unclear (handed off);
- some get a second customer message 0.3-4 s after the first (sometimes after the router ended the turn, so
  a new turn starts and the canned reply must not go out again);
- some are taken over by a person while pending (assigned to a person, or opened by an agent);
- some are edited by a person 1-4 s after the router ended them (reopened, assigned, labelled);
- each worker has a ROUTER_WORKER_ID (static group membership) unless `--no-worker-ids`;
- `--fault-rate` of them get one Chatwoot fault on a request the router makes for them: 503 before the
  change, the change applied then 503, or the change applied then the connection closed;
- `--slow-mutation-rate` of the others get one mutation that Chatwoot answers (and applies) only after 20 s,
  longer than the workers' 5 s revoke drain, so partitions move while it is in flight;
- `--slow-broker-ms` puts a proxy that delays every byte between the clients and the broker (a slow leader);
- `--forget-rate` of them are forgotten (issue 32) with the real `chatwoot-router forget --conversation A:C`: half
  0.5-8 s after the router ended the turn, a quarter around the first customer message (`forget` started 1 s
  before to 0.5 s after it: its request lands before, during or after the router's turn), a quarter while Chatwoot
  holds one of the router's mutations for 20 s; a `forget` that fails (its worker killed and not back within its
  timeout) is run again.

Meanwhile it SIGKILLs a random worker (sometimes the ingress) `--kills` times, each restarted 0.1-2 s later,
freezes a random healthy worker `--pauses` times for 20-40 s (SIGSTOP, then SIGCONT: longer than its 15 s session,
so the group gives its partitions away while it sleeps; it must fence itself when it wakes; with
`--pause-in-recovery` each pause first restarts its worker and freezes it the moment it holds partitions it has not
recovered yet, /healthz 503 with `partitions` > 0), and stops the broker
`--broker-restarts` times (SIGTERM and SIGKILL alternately, restarted on the same data dir 1-4 s later).
A process that exits by itself is restarted too, and reported.

Then it settles (every process up and healthy, webhooks delivered, no API call for a while), requests an
operator sweep (`chatwoot-router sweep`), waits until every conversation ended and every record is folded
(each a condition with a deadline), runs `chatwoot-router audit --verify` with the workers' environment and
hands everything to the independent verifier (`bench/chaos_verify.py`). It prints the violations, one line
each, and one summary line:

    chaos: seed=7 conversations=200 kills=100 duplicates=0 stale_mutations=0 unfolded=0 unended=0
    audit_differences=0 skipped_records=0 wrong_tokens=0 raced=0 jev_repeats=0 broker_restarts=0 ... PASS

and exits 1 on any violation (2 when the stack could not be started). `--json FILE` writes the whole report:
options, the timeline of kills and restarts, the counts, every violation with the requests and offsets
involved. Process logs stay in the work directory (printed at the start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.chaos_verify import (
    CONVERSATION_KEY,
    FORGET_CHECKS,
    Evidence,
    Verdict,
    check,
    collect,
    parse_audit,
    read_topic,
)
from bench.latency_proxy import LatencyProxy
from handlers.processes import Child
from handlers.worker.fencing import FAIL_STOP
from sandbox.scenario import from_config
from schemas.config import parse_config
from streams.kafka.cluster import LocalCluster, start_cluster
from streams.kafka.local import LocalKafka, free_port, start_broker
from streams.worker_cmd import STARTING_AGAIN
from tests.support.env import TEST_KEK

ROOT = Path(__file__).resolve().parents[1]
USER_TOKEN = "chaos-user-token"
BOT_TOKENS = {1: "chaos-bot-1"}
BOT_SECRETS = {1: "chaos-secret-1"}
BOT_IDS = {1: 5}
API_KEY = "chaos-jev-key"
ADMIN, BILLING, SALES = 1, 2, 3  # user ids: the administrator (token owner) and the two owners (agents)
INBOX = 101
RETRY_BASE_MS = 200
SWEEP_INTERVAL_S = 3600  # only the sweeps of worker starts and the operator's; the final sweep is requested
QUIET_S = 3.0  # "settled": no Chatwoot API call for this long
FORGET_TIMEOUT_S = 180  # `forget --timeout`: longer than a killed worker's restart and its partitions' recovery
FORGET_ATTEMPTS = 3
FORGET_LEAD_S = 1.0  # mid-route: the first customer message this long after `forget` is started (0-1.5 s after)

TEXTS: dict[str, tuple[str, ...]] = {
    "billing": (
        "I was charged twice on my invoice, please refund the payment",
        "My invoice shows a double charge, I need a refund of the payment",
    ),
    "sales": (
        "Can I get a sales quote and pricing plans for a discount?",
        "Please send a quote with your pricing plans and any discount",
    ),
    "hours": (
        "What are your opening hours? When is the shop open or closed?",
        "When are you open? I need the opening hours of the shop",
    ),
    "spam": (
        "Casino spam advertising: unsolicited marketing offers for you",
        "Unsolicited advertising: casino marketing offers, spam deals",
    ),
    "newsletter": (
        "Weekly newsletter digest: our mailing list announcements",
        "Newsletter digest from the mailing list with announcements",
    ),
    "unclear": (
        "Something odd happened with the thing yesterday, see below",
        "The thing from yesterday happened again, it seems odd",
    ),
}
KIND_WEIGHTS = {"billing": 20, "sales": 15, "hours": 20, "spam": 15, "newsletter": 15, "unclear": 15}
# the requests the router makes for each kind, where a fault can be injected
FAULT_OPS = {
    "billing": ("get_conversation", "list_messages", "assign"),
    "sales": ("get_conversation", "list_messages", "assign"),
    "hours": ("list_messages", "set_labels", "create_message", "toggle_status", "assign"),
    "spam": ("get_conversation", "set_labels", "toggle_status", "assign"),
    "newsletter": ("list_messages", "set_labels", "toggle_status", "assign"),
    "unclear": ("get_conversation", "list_messages", "toggle_status"),
}
FAULT_MODES = ("fail", "apply_then_fail", "apply_then_drop")


def router_config(sandbox_url: str) -> dict[str, Any]:
    return {
        "chatwoot": {"baseUrl": sandbox_url},
        "routing": {
            "endpoint": f"{sandbox_url}/v1/systemone",
            "botIds": {"1": BOT_IDS[1]},
            "accounts": {
                "1": {
                    "billing": {"assignee": BILLING, "covers": "Billing, invoices, charges, payments and refunds."},
                    "sales": {"assignee": SALES, "covers": "Sales quotes, pricing plans and discounts."},
                }
            },
            "kinds": {
                "1": {
                    "spam": {
                        "covers": "Spam, advertising, unsolicited marketing offers, casino.",
                        "status": "resolved",
                    },
                    "hours": {
                        "covers": "Opening hours, when the shop is open or closed.",
                        "cannedResponse": "hours",
                        "status": "resolved",
                    },
                    "newsletter": {"covers": "Newsletters, digests, mailing list announcements.", "status": "snoozed"},
                }
            },
        },
    }


# --- the plan --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What happens to one conversation; times are seconds from the start of the play."""

    index: int
    kind: str
    tag: str  # a made-up word in every message, unique to the conversation (to follow its System One input)
    start_s: float
    second_after_s: float | None = None
    takeover_after_s: float | None = None
    takeover: str | None = None  # "assign" (an admin assigns an agent) or "open" (an agent opens it)
    edit_after_s: float | None = None
    edits: list[str] = field(default_factory=list)  # "reopen", "assign", "label"
    fault: dict[str, Any] | None = None
    forget_when: str | None = None  # "mid_route" (after the first message) or "after_end" (after the router ended it)
    forget_after_s: float | None = None  # seconds after that moment
    forget: dict[str, Any] | None = None  # what `forget` did: when it was asked, each attempt's exit code
    conversation_id: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"1:{self.conversation_id}"


def _tag(index: int) -> str:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    word, n = "zq", index
    for _ in range(3):
        word += consonants[n % len(consonants)] + vowels[(n // len(consonants)) % len(vowels)]
        n //= len(consonants) * len(vowels)
    return word


MUTATIONS = ("set_labels", "toggle_status", "assign")
SLOW_MUTATION_MS = 20_000  # longer than the 5 s revoke drain: the partition moves while Chatwoot still holds it


def make_plans(
    count: int, duration_s: float, fault_rate: float, rng: random.Random, slow_mutation_rate: float = 0.0
) -> list[Plan]:
    kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
    starts = sorted(rng.uniform(0, duration_s) for _ in range(count))
    plans = []
    for index, start in enumerate(starts):
        plan = Plan(index, rng.choices(kinds, weights)[0], _tag(index), start)
        roll = rng.random()
        if roll < 0.12:
            plan.takeover_after_s = rng.uniform(0.0, 1.5)
            plan.takeover = rng.choice(("assign", "open"))
        elif roll < 0.37:
            plan.edit_after_s = rng.uniform(1.0, 4.0)
            plan.edits = rng.sample(["reopen", "assign", "label"], rng.randint(1, 3))
        if rng.random() < 0.2:
            plan.second_after_s = rng.uniform(0.3, 4.0)
        if rng.random() < fault_rate:
            plan.fault = {
                "op": rng.choice(FAULT_OPS[plan.kind]),
                "mode": rng.choice(FAULT_MODES),
                "status": 503,
                "times": 1,
            }
        plans.append(plan)
    # draws of its own, and only when asked: a seed's plans without slow mutations stay as they were
    slow = random.Random(rng.random()) if slow_mutation_rate else None
    for plan in plans:
        if slow is not None and plan.fault is None and slow.random() < slow_mutation_rate:
            ops = [op for op in FAULT_OPS[plan.kind] if op in MUTATIONS]
            plan.fault = {"op": slow.choice(ops), "mode": "delay", "delay_ms": SLOW_MUTATION_MS, "times": 1}
    return plans


def plan_forgets(plans: list[Plan], rate: float, seed: int) -> None:
    """Pick `rate` of the plans to forget (an RNG of their own: a seed's other draws stay as they were): half a
    while after the router ended the turn (`after_end`); a quarter around the first message (`mid_route`: the
    router often ends a turn within a second, so some of these land before or after it); a quarter while Chatwoot
    holds one of the router's mutations for 20 s (`mid_mutation`: a conversation without a fault or a takeover gets
    that slow mutation, and is forgotten 1.5-10 s after its first message; a person's takeover while Chatwoot holds
    a mutation would make it a `late_mutation` that has nothing to do with forgetting)."""
    if rate <= 0:
        return
    rng = random.Random(f"forget-{seed}")
    chosen = rng.sample(plans, min(len(plans), round(rate * len(plans))))
    for n, plan in enumerate(sorted(chosen, key=lambda p: p.index)):
        if n % 2 == 1:
            plan.forget_when, plan.forget_after_s = "after_end", rng.uniform(0.5, 8.0)
        elif (
            n % 4 == 0 or plan.fault is not None or plan.takeover is not None
        ):  # started 0-1.5 s after the conversation is made: FORGET_LEAD_S
            plan.forget_when, plan.forget_after_s = "mid_route", rng.uniform(0.0, 1.5)  # before its first message
        else:
            ops = [op for op in FAULT_OPS[plan.kind] if op in MUTATIONS]
            plan.fault = {"op": rng.choice(ops), "mode": "delay", "delay_ms": SLOW_MUTATION_MS, "times": 1}
            plan.forget_when, plan.forget_after_s = "mid_mutation", rng.uniform(1.5, 10.0)


# --- processes -------------------------------------------------------------------------------------------


class Proc(Child):
    """One `chatwoot-router` subcommand as a child process (`handlers.processes.Child`), its output appended to a
    log file with a line per start, and whether the harness wants it running."""

    def __init__(
        self, name: str, args: list[str], env: dict[str, str], log_dir: Path, health_url: str, cwd: Path = ROOT
    ) -> None:
        super().__init__(name, args, env, log_dir / f"{name}.log", cwd=cwd, append=True)
        self.health_url = health_url
        self.wanted = False  # should be running (the supervisor restarts it when it exits by itself)
        self.starts = 0
        self.started_at = 0.0

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.starts + 1} at {time.time():.3f} ===\n".encode())
        super().start()
        self.starts += 1
        self.started_at = time.monotonic()
        self.wanted = True

    def kill(self) -> None:
        self.wanted = False
        super().kill()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        self.wanted = False
        super().stop(sig, timeout_s)

    def log_tail(self, lines: int = 12) -> str:
        return super().log_tail(lines)


@dataclass
class Options:
    conversations: int = 40
    kills: int = 10
    seed: int = 1
    workers: int = 2
    partitions: int = 8
    broker_restarts: int = 0
    brokers: int = 1  # 3: a local three-node cluster (streams/kafka/cluster.py); a restart hits one node
    duration_s: float | None = None
    fault_rate: float = 0.3
    json_path: Path | None = None
    work_dir: Path | None = None
    settle_deadline_s: float = 240.0
    code_dir: Path = ROOT  # where the router's processes (ingress, workers, sweep, audit) run from
    worker_ids: bool = True  # ROUTER_WORKER_ID per worker (static membership: a restart keeps its partitions)
    pauses: int = 0  # SIGSTOP a worker for 20-40 s (past its 15 s session), then SIGCONT (issue 34)
    pause_in_recovery: bool = False  # ... the moment a restarted worker holds partitions it still recovers (issue 40)
    slow_broker_ms: int = 0  # every byte to and from the broker this late (bench/latency_proxy.py; one broker only)
    slow_mutation_rate: float = 0.0  # share of conversations with one mutation Chatwoot answers only after 20 s
    realistic: bool = False  # the sandbox as rough as the real Chatwoot (issue 30): rate limit, webhooks out of order
    secure: bool = False  # SASL_SSL brokers with ACLs; each process under its role's principal (issue 31)
    forget_rate: float = 0.0  # share of conversations forgotten with `chatwoot-router forget` meanwhile (issue 32)

    @property
    def play_s(self) -> float:
        return self.duration_s if self.duration_s is not None else max(20.0, 1.5 * self.conversations)


@dataclass
class Result:
    options: Options
    verdict: Verdict
    duration_s: float
    timeline: list[dict[str, Any]]
    work_dir: Path
    app_id: str
    broker_restarts: int
    self_exits: int
    starts_again: int = 0  # a worker replaced itself after a Kafka error (same pid: `self_exits` cannot see it)
    fail_stops: int = 0  # ... of which a worker stopped without committing (a broken barrier, fenced after a pause)

    def summary(self) -> str:
        c = self.verdict.counts
        o = self.options
        fields = [
            f"seed={o.seed}",
            f"conversations={o.conversations}",
            f"kills={o.kills}",
            *(
                f"{name}={c[name]}"
                for name in ("duplicates", "stale_mutations", "late_mutations", "unfolded", "unended")
            ),
            f"audit_differences={c['audit_differences']}",
            *(f"{name}={c[name]}" for name in ("skipped_records", "wrong_tokens", "stale_writes", "raced")),
            f"forgets={sum(1 for p in self.verdict.info.get('plans', []) if p.get('forget'))}",
            *(f"{name}={c[name]}" for name in FORGET_CHECKS),
            f"repeated_mutations={c['repeated_mutations']}",
            f"jev_repeats={c['jev_repeats']}",
            f"late_folds={c['late_folds']}",
            f"stale_reads={c['stale_reads']}",
            f"read_to_mutation_max={self.verdict.info.get('read_to_mutation_ms', {}).get('max', 0):.0f}ms",
            f"max_fold_lag={self.verdict.info['fold_lag_s']['max']:.1f}s",
            f"brokers={o.brokers}",
            f"broker_restarts={self.broker_restarts}",
            f"self_exits={self.self_exits}",
            f"starts_again={self.starts_again}",
            f"pauses={o.pauses}",
            f"fail_stops={self.fail_stops}",
            f"duration={self.duration_s:.0f}s",
        ]
        return f"chaos: {' '.join(fields)} {'PASS' if self.verdict.passed else 'FAIL'}"

    def to_json(self) -> dict[str, Any]:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.options).items()}
        return {
            "summary": self.summary(),
            "options": options,
            "code": code_version(self.options.code_dir),
            "app_id": self.app_id,
            "work_dir": str(self.work_dir),
            "duration_s": self.duration_s,
            "timeline": self.timeline,
            **self.verdict.to_json(),
        }


class StackFailed(RuntimeError):
    """The stack could not be started; the message names the process and quotes its log."""


class Chaos:
    def __init__(self, options: Options, bootstrap: str | None = None) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        self.work = options.work_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{options.seed}-"))
        self.work.mkdir(parents=True, exist_ok=True)
        if bootstrap is not None and options.broker_restarts:
            raise ValueError("broker restarts need the test's own broker (no bootstrap servers given)")
        self.external_bootstrap = bootstrap
        self.broker: LocalKafka | None = None
        self.cluster: LocalCluster | None = None
        self.proxy: LatencyProxy | None = None  # --slow-broker-ms
        self.broker_port = free_port()
        self.broker_down = False
        self.started = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.plans = make_plans(
            options.conversations, options.play_s, options.fault_rate, self.rng, options.slow_mutation_rate
        )
        plan_forgets(self.plans, options.forget_rate, options.seed)
        self.forgets: list[asyncio.Task[None]] = []  # the `forget` runs, awaited at the end of the play
        self.app_id = f"chaos-{options.seed}-{int(time.time())}"
        self.sandbox_port, self.ingress_port = free_port(), free_port()
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.procs: list[Proc] = []
        self.workers: list[Proc] = []
        self.broker_restarts = 0
        self.self_exits = 0
        self.http: httpx.AsyncClient | None = None

    # --- bookkeeping ---

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, what: str, **data: Any) -> None:
        self.timeline.append({"t": round(self.now(), 3), "wall": round(time.time(), 3), "what": what, **data})
        print(f"[{self.now():7.1f}s] {what} {json.dumps(data) if data else ''}", file=sys.stderr, flush=True)

    @property
    def bootstrap(self) -> str:
        if self.cluster is not None:
            return self.cluster.bootstrap
        return self.external_bootstrap or f"127.0.0.1:{self.broker_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "CHATWOOT_", "TYPESAFE_"))}
        env.update(
            ROUTER_CONFIG=str(self.work / "router.json"),
            KAFKA_BOOTSTRAP_SERVERS=self.bootstrap,
            ROUTER_APP_ID=self.app_id,
            ROUTER_PARTITIONS=str(self.o.partitions),
            ROUTER_DATA_DIR=str(self.work / "state"),
            ROUTER_RETRY_BASE_MS=str(RETRY_BASE_MS),
            ROUTER_SWEEP_INTERVAL_S=str(SWEEP_INTERVAL_S),
            CHATWOOT_TOKEN=USER_TOKEN,
            CHATWOOT_AGENT_BOT_TOKENS=json.dumps({str(k): v for k, v in BOT_TOKENS.items()}),
            CHATWOOT_AGENT_BOT_SECRETS=json.dumps({str(k): v for k, v in BOT_SECRETS.items()}),
            TYPESAFE_API_KEY=API_KEY,
            ROUTER_KEY_ENCRYPTION_KEY=TEST_KEK,
        )
        return self.as_role(env, "admin")

    # --- the stack ---

    def write_files(self) -> None:
        config = router_config(self.sandbox_url)
        (self.work / "router.json").write_text(json.dumps(config, indent=2))
        scenario = from_config(
            parse_config(config), user_token=USER_TOKEN, bot_tokens=BOT_TOKENS, bot_secrets=BOT_SECRETS, api_key=API_KEY
        )
        scenario["accounts"][0]["keep_pending_on_bot_failure"] = True  # a lost webhook leaves it to the sweep
        (self.work / "scenario.json").write_text(json.dumps(scenario, indent=2))

    def start_broker(self) -> None:
        advertised = self.proxy.port if self.proxy is not None else None
        self.broker = start_broker(
            self.broker_port, self.work / "kafka", advertised_port=advertised, secure=self.o.secure, app_id=self.app_id
        )
        self.broker_down = False

    async def start_stack(self) -> None:
        self.write_files()
        if self.external_bootstrap is None and self.o.brokers > 1:
            self.note("starting a three-node cluster")
            self.cluster = await asyncio.to_thread(
                start_cluster, None, self.work / "kafka-cluster", secure=self.o.secure, app_id=self.app_id
            )
            self.note("cluster up", bootstrap=self.cluster.bootstrap)
        elif self.external_bootstrap is None:
            if self.o.slow_broker_ms:  # clients reach the broker through a proxy that delays every byte
                self.proxy = LatencyProxy(free_port(), self.broker_port, self.o.slow_broker_ms / 1000)
                await self.proxy.start()
                self.note("a slow broker: every byte through a proxy", port=self.proxy.port, ms=self.o.slow_broker_ms)
            self.note("starting the broker", port=self.broker_port)
            await asyncio.to_thread(self.start_broker)
        if self.o.secure:
            await self.secure_roles()
        env = self.env()
        webhook_url = f"http://127.0.0.1:{self.ingress_port}/chatwoot/agent-bot"
        sandbox_args = ["sandbox", "--port", str(self.sandbox_port), "--scenario", str(self.work / "scenario.json")]
        sandbox = Proc(
            "sandbox",
            [
                *sandbox_args,
                "--webhook-url",
                webhook_url,
                "--retry-delay",
                "1.0",
                *(["--realistic", "--seed", str(self.o.seed)] if self.o.realistic else []),
            ],
            env,
            self.work,
            f"{self.sandbox_url}/_sandbox/state",
        )
        ingress = Proc(
            "ingress",
            ["ingress", "--host", "127.0.0.1", "--port", str(self.ingress_port)],
            self.as_role(env, "ingress"),
            self.work,
            f"http://127.0.0.1:{self.ingress_port}/healthz",
            self.o.code_dir,
        )
        for n in range(self.o.workers):
            port = free_port()
            worker_env = dict(self.as_role(env, "worker"), ROUTER_DATA_DIR=str(self.work / f"state-{n + 1}"))
            if self.o.worker_ids:  # static group membership, as docker-compose.yml names its workers
                worker_env["ROUTER_WORKER_ID"] = f"worker-{n + 1}"
            self.workers.append(
                Proc(
                    f"worker-{n + 1}",
                    ["worker", "--web-port", str(port)],
                    worker_env,
                    self.work,
                    f"http://127.0.0.1:{port}/healthz",
                    self.o.code_dir,
                )
            )
        self.procs = [sandbox, ingress, *self.workers]
        for proc in self.procs:
            proc.start()
        for proc in self.procs:
            await self.wait_healthy(proc, 180)
        self.note("stack up", app_id=self.app_id, work_dir=str(self.work), bootstrap=self.bootstrap)

    @property
    def properties_dir(self) -> Path | None:
        """A secured cluster's client properties files (None in plaintext)."""
        kafka = self.cluster if self.cluster is not None else self.broker
        return kafka.properties_dir if kafka is not None and self.o.secure else None

    def as_role(self, env: dict[str, str], role: str) -> dict[str, str]:
        """`env` under `role`'s principal on a secured cluster (the administrator's otherwise: sweep, audit)."""
        folder = self.properties_dir
        return env if folder is None else dict(env, KAFKA_CLIENT_PROPERTIES=str(folder / f"{role}.properties"))

    async def secure_roles(self) -> None:
        """On a secured cluster: this process (the verifier's reads) as the administrator, and the app's topics
        created ahead by `config apply` as the administrator (workers have no Create right)."""
        from handlers.kafka import security

        folder = self.properties_dir
        assert folder is not None
        os.environ["KAFKA_CLIENT_PROPERTIES"] = str(folder / "admin.properties")
        security.reset()
        applied = await asyncio.to_thread(self.run_cli, "config", "apply", str(self.work / "router.json"))
        if applied.returncode != 0:
            raise StackFailed(f"config apply as the administrator failed:\n{applied.stdout}{applied.stderr}")
        self.note("secured: topics made ahead, each process under its role", properties=str(folder))

    async def healthy(self, proc: Proc) -> bool:
        assert self.http is not None
        try:
            return (await self.http.get(proc.health_url, timeout=3)).status_code == 200
        except httpx.HTTPError:
            return False

    async def recovering(self, proc: Proc) -> bool:
        """Whether `proc` holds partitions it has not recovered yet, or is in a rebalance (/healthz 503 with
        partitions)."""
        assert self.http is not None
        try:
            answer = await self.http.get(proc.health_url, timeout=1)
        except httpx.HTTPError:
            return False
        return answer.status_code == 503 and answer.json().get("partitions", 0) > 0

    async def wait_healthy(self, proc: Proc, deadline_s: float) -> None:
        async def check() -> bool:
            if not proc.alive():
                raise StackFailed(f"{proc.name} exited ({proc.popen and proc.popen.returncode}):\n{proc.log_tail()}")
            return await self.healthy(proc)

        if not await wait_for(check, deadline_s, every_s=0.25):
            raise StackFailed(f"{proc.name} not healthy within {deadline_s:.0f} s:\n{proc.log_tail()}")

    def stop_stack(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if self.broker is not None:
            self.broker.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def fail_stops(self) -> int:
        """How often a worker stopped without committing (`handlers/worker/fencing.py`) and started again."""
        return sum(
            w.log_path.read_text(encoding="utf-8", errors="replace").count(FAIL_STOP)
            for w in self.workers
            if w.log_path.exists()
        )

    def starts_again(self) -> int:
        """How often a worker started again in its own process after a Kafka error (`streams/worker_cmd.py`)."""
        return sum(
            w.log_path.read_text(encoding="utf-8", errors="replace").count(STARTING_AGAIN)
            for w in self.workers
            if w.log_path.exists()
        )

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a process that exited by itself (not killed by us), and report it."""
        while not stop.is_set():
            for proc in self.procs:
                if proc.wanted and not proc.alive() and time.monotonic() - proc.started_at > 2.0:
                    code = proc.popen.returncode if proc.popen else None
                    self.self_exits += 1
                    self.note("exited by itself; restarting", process=proc.name, code=code, log=proc.log_tail(6))
                    proc.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    # --- the sandbox's control API ---

    async def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        assert self.http is not None
        response = await self.http.request(method, f"{self.sandbox_url}/_sandbox{path}", json=body, timeout=30)
        if not response.is_success:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    async def conversation(self, plan: Plan) -> dict[str, Any]:
        result: dict[str, Any] = await self.control("GET", f"/conversations/1/{plan.conversation_id}")
        return result

    @staticmethod
    def ended(state: dict[str, Any]) -> bool:
        return state["status"] != "pending" and state.get("bot_assignee_id") is None

    # --- the play ---

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))

    async def say(self, plan: Plan, second: bool = False) -> None:
        texts = TEXTS[plan.kind]
        text = texts[1] if second else texts[0]
        await self.control(
            "POST", f"/conversations/1/{plan.conversation_id}/incoming", {"content": f"{text} Ref {plan.tag}."}
        )

    async def play_one(self, plan: Plan, base: float) -> None:
        await self.sleep_until(base + plan.start_s)
        created = await self.control(
            "POST",
            "/conversations",
            {"account_id": 1, "inbox_id": INBOX, "contact_name": f"Chaos Customer {plan.index}"},
        )
        plan.conversation_id = int(created["id"])
        if plan.fault is not None:
            await self.control(
                "POST", "/faults", {**plan.fault, "account_id": 1, "conversation_id": plan.conversation_id}
            )
        if plan.forget_when == "mid_route":
            # `forget` needs 0.5-1.3 s to start and the router often ends a turn within a second, so it is started
            # first and the customer writes FORGET_LEAD_S later: its request lands before, during or after the turn
            self.forgets.append(asyncio.create_task(self.forget(plan, self.now(), base)))
            await asyncio.sleep(FORGET_LEAD_S)
        first = self.now()
        await self.say(plan)
        if plan.forget_when in ("after_end", "mid_mutation"):
            self.forgets.append(asyncio.create_task(self.forget(plan, first, base)))
        steps: list[tuple[float, str]] = []
        if plan.second_after_s is not None:
            steps.append((first + plan.second_after_s, "second"))
        if plan.takeover_after_s is not None:
            steps.append((first + plan.takeover_after_s, "takeover"))
        for at, step in sorted(steps):
            await self.sleep_until(at)
            if step == "second":
                await self.say(plan, second=True)
            else:
                await self.take_over(plan)
        if plan.edits:
            await self.edit_after_end(plan, base)

    async def take_over(self, plan: Plan) -> None:
        state = await self.conversation(plan)
        if state["status"] != "pending":
            plan.notes.append(f"takeover skipped: already {state['status']}")
            return
        path = f"/conversations/1/{plan.conversation_id}"
        if plan.takeover == "assign":
            await self.control("POST", f"{path}/assign", {"user_id": ADMIN, "assignee_id": SALES})
        else:
            await self.control("POST", f"{path}/status", {"user_id": BILLING, "status": "open"})
        plan.notes.append(f"taken over while pending ({plan.takeover})")

    async def edit_after_end(self, plan: Plan, base: float) -> None:
        deadline = max(60.0, base + self.o.play_s + 30 - self.now())

        async def ended() -> bool:  # or forgotten before it ended (then it never will)
            return plan.forget is not None or self.ended(await self.conversation(plan))

        if not await wait_for(ended, deadline, every_s=0.5):
            plan.notes.append("edits skipped: not ended in time")
            return
        if not self.ended(await self.conversation(plan)):
            plan.notes.append("edits skipped: forgotten before the end")
            return
        assert plan.edit_after_s is not None
        await asyncio.sleep(plan.edit_after_s)  # a person looks at it a few seconds after the router ended it
        path = f"/conversations/1/{plan.conversation_id}"
        for edit in plan.edits:
            state = await self.conversation(plan)
            if edit == "reopen" and state["status"] in ("resolved", "snoozed"):
                await self.control("POST", f"{path}/status", {"user_id": BILLING, "status": "open"})
            elif edit == "assign" or edit == "reopen":
                other = SALES if state.get("assignee_id") != SALES else BILLING
                await self.control("POST", f"{path}/assign", {"user_id": ADMIN, "assignee_id": other})
            else:
                await self.control("POST", f"{path}/labels", {"user_id": ADMIN, "add": ["vip"]})
            plan.notes.append(f"edited after the end: {edit}")
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))

    async def play(self) -> None:
        base = self.now()
        results = await asyncio.gather(*(self.play_one(plan, base) for plan in self.plans), return_exceptions=True)
        for plan, result in zip(self.plans, results, strict=True):
            if isinstance(result, BaseException):
                plan.notes.append(f"play failed: {type(result).__name__}: {result}")
                self.note("a conversation's play failed", index=plan.index, error=f"{type(result).__name__}: {result}")
        for result in await asyncio.gather(*self.forgets, return_exceptions=True):
            if isinstance(result, BaseException):
                self.note("a forget failed to run", error=f"{type(result).__name__}: {result}")

    # --- forgetting (issue 32) ---

    async def forget(self, plan: Plan, since: float, base: float) -> None:
        """Forget the conversation with `chatwoot-router forget` at the planned moment (`forget_after_s` after
        `since`, mid-route; or that long after the router ended the turn), and run it again while it fails (a
        worker killed and not back in time)."""
        assert plan.forget_after_s is not None
        if plan.forget_when == "after_end":
            deadline = max(60.0, base + self.o.play_s + 30 - self.now())

            async def ended() -> bool:
                return self.ended(await self.conversation(plan))

            if not await wait_for(ended, deadline, every_s=0.5):
                plan.notes.append("forget: not ended in time, forgotten anyway")
            await asyncio.sleep(plan.forget_after_s)
        else:  # mid_route: `since` is when the conversation was made; mid_mutation: its first message
            await self.sleep_until(since + plan.forget_after_s)
        state = await self.conversation(plan)
        plan.forget = {
            "when": plan.forget_when,
            "asked_at_s": round(self.now(), 3),
            "pending": not self.ended(state),
            "attempts": [],
            "confirmed": False,
        }
        self.note("forget", conversation=plan.key, when=plan.forget_when, pending=plan.forget["pending"])
        for attempt in range(1, FORGET_ATTEMPTS + 1):
            started = self.now()
            code, output = await self.run_cli_async(
                *("forget", "--conversation", plan.key, "--reason", "chaos", "--timeout", str(FORGET_TIMEOUT_S)),
                role="privacy",
            )
            plan.forget["attempts"].append(
                {"start_s": round(started, 3), "end_s": round(self.now(), 3), "code": code, "output": output[-400:]}
            )
            self.note(
                "forget done" if code == 0 else "forget failed", conversation=plan.key, attempt=attempt, code=code
            )
            if code == 0:
                plan.forget["confirmed"] = True
                return
            if await self.forgotten_on_log(plan.key):
                # asked again, an already forgotten conversation gets no new proof: not run again (the verifier
                # counts the unconfirmed `forget` as incomplete)
                plan.forget["on_log_unconfirmed"] = True
                return
            await asyncio.sleep(2.0)

    async def forgotten_on_log(self, key: str) -> bool:
        events = await read_topic(self.bootstrap, f"{self.app_id}.conversations")
        return any(r.key == key and isinstance(r.value, dict) and r.value.get("type") == "forgotten" for r in events)

    async def run_cli_async(self, *args: str, role: str = "admin") -> tuple[int | None, str]:
        """A `chatwoot-router` command as a child process, without holding a thread, under `role` on a secured
        cluster: (exit code, its output)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "streams.cli",
            *args,
            cwd=self.o.code_dir,
            env=self.as_role(self.env(), role),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(FORGET_TIMEOUT_S + 60):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            return None, out.decode("utf-8", "replace") + "\n(killed: no exit in time)"
        return proc.returncode, out.decode("utf-8", "replace")

    # --- the chaos ---

    async def kill_loop(self) -> None:
        times = sorted(self.rng.uniform(0.05, 1.0) * self.o.play_s for _ in range(self.o.kills))
        base = self.now()
        ingress = next(p for p in self.procs if p.name == "ingress")
        for n, at in enumerate(times, 1):
            await self.sleep_until(base + at)
            victim = ingress if self.rng.random() < 0.15 else self.rng.choice(self.workers)
            pid = victim.pid
            victim.kill()
            delay = self.rng.uniform(0.1, 2.0)
            self.note(f"kill {n}/{self.o.kills}", process=victim.name, pid=pid, restart_in_s=round(delay, 2))
            await asyncio.sleep(delay)
            victim.start()

    async def pause_loop(self) -> None:
        """Freeze a random worker (SIGSTOP) for longer than its session, then let it go on (SIGCONT): the group
        gives its partitions to another worker meanwhile, and it must write nothing and make no mutation after
        it wakes up (issue 34: it is fenced and starts again)."""
        times = sorted(self.rng.uniform(0.1, 0.8) * self.o.play_s for _ in range(self.o.pauses))
        base = self.now()
        for n, at in enumerate(times, 1):
            await self.sleep_until(base + at)
            victim = self.rng.choice(self.workers)
            # a worker that folds what it owns (healthy for a moment: its fence is armed), not one still starting
            if not await wait_for(functools.partial(self.healthy, victim), 30, every_s=0.5):
                continue
            if self.o.pause_in_recovery:
                # restarted, and frozen while it recovers the partitions it was just given (its /healthz still 503)
                victim.kill()
                victim.start()
                if not await wait_for(functools.partial(self.recovering, victim), 30, every_s=0.02):
                    self.note(f"pause {n}/{self.o.pauses} skipped: no recovery caught", process=victim.name)
                    continue
            else:
                await asyncio.sleep(1.5)
            pid = victim.pid
            if pid is None or not victim.alive():
                continue
            pause_s = self.rng.uniform(20.0, 40.0)
            starts = victim.starts
            os.kill(pid, signal.SIGSTOP)
            self.note(f"pause {n}/{self.o.pauses}", process=victim.name, pid=pid, for_s=round(pause_s, 1))
            await asyncio.sleep(pause_s)
            # not killed meanwhile (the kill loop may hit a frozen worker; between its kill and the restart the
            # pid is still the dead one's): only a worker that wakes must fence itself
            if victim.starts == starts and victim.wanted and victim.pid == pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                self.note(f"resumed {n}/{self.o.pauses}", process=victim.name, pid=pid)
                await asyncio.sleep(5.0)  # it wakes and runs before the next pause (which may be due already)

    async def broker_loop(self) -> None:
        if self.o.broker_restarts == 0:
            return
        base = self.now()
        slots = self.o.broker_restarts
        times = [(0.15 + 0.75 * (n + self.rng.uniform(0.2, 0.8)) / slots) * self.o.play_s for n in range(slots)]
        for n, at in enumerate(times):
            await self.sleep_until(base + at)
            how = "SIGTERM" if n % 2 == 0 else "SIGKILL"
            if self.cluster is not None:
                await self.restart_node(n, slots, how)
                continue
            assert self.broker is not None
            self.broker_down = True
            self.note(f"broker stop {n + 1}/{slots}", signal=how)
            await asyncio.to_thread(self.broker.stop if how == "SIGTERM" else self.broker.kill)
            down_s = self.rng.uniform(1.0, 4.0)
            stopped = time.monotonic()
            samples: dict[str, list[str]] = {w.name: [] for w in self.workers}
            while time.monotonic() - stopped < down_s:  # /healthz every 0.5 s while the broker is away
                for w in self.workers:
                    ok = w.alive() and await self.healthy(w)
                    samples[w.name].append(f"{time.monotonic() - stopped:.1f}s:{200 if ok else 'not 200'}")
                await asyncio.sleep(0.5)
            self.note("workers' /healthz while the broker is down", samples=samples)
            await asyncio.to_thread(self.start_broker)
            self.broker_restarts += 1
            self.note(f"broker up again {n + 1}/{slots}")

    async def restart_node(self, n: int, slots: int, how: str) -> None:
        """One node of the cluster, picked at random, stopped for a while and started again; the other two keep
        serving (min ISR 2 of 3), so the workers should stay healthy throughout."""
        assert self.cluster is not None
        index = self.rng.randrange(len(self.cluster.nodes))
        self.note(f"broker stop {n + 1}/{slots}", signal=how, node=index + 1)
        if how == "SIGTERM":
            await asyncio.to_thread(self.cluster.terminate, index)
        else:
            await asyncio.to_thread(self.cluster.kill, index)
        down_s = self.rng.uniform(2.0, 8.0)
        stopped = time.monotonic()
        samples: dict[str, list[str]] = {w.name: [] for w in self.workers}
        while time.monotonic() - stopped < down_s:
            for w in self.workers:
                ok = w.alive() and await self.healthy(w)
                samples[w.name].append(f"{time.monotonic() - stopped:.1f}s:{200 if ok else 'not 200'}")
            await asyncio.sleep(0.5)
        self.note("workers' /healthz while one node is down", node=index + 1, samples=samples)
        await asyncio.to_thread(self.cluster.restart, index)
        self.broker_restarts += 1
        self.note(f"broker up again {n + 1}/{slots}", node=index + 1)

    # --- settling ---

    async def last_seq(self) -> int:
        log = await self.control("GET", "/log?include=")
        return int(log["last_seq"])

    async def wait_quiet(self, deadline_s: float) -> bool:
        """Until no Chatwoot API call or control action happened for QUIET_S."""
        last_seq, since = -1, time.monotonic()

        async def quiet() -> bool:
            nonlocal last_seq, since
            seq = await self.last_seq()
            if seq != last_seq:
                last_seq, since = seq, time.monotonic()
            return time.monotonic() - since >= QUIET_S

        return await wait_for(quiet, deadline_s, every_s=0.5)

    async def all_ended(self) -> bool:
        state = await self.control("GET", "/state")
        # a forgotten conversation is never routed again: it may stay pending (verify: check_forgets)
        keys = {p.key for p in self.plans if p.conversation_id is not None and p.forget is None}
        return all(self.ended(c) for c in state["conversations"] if f"{c['account_id']}:{c['id']}" in keys)

    async def all_folded(self) -> bool:
        """Every key's last record on the conversations topic is what its last state applied."""
        events = await read_topic(self.bootstrap, f"{self.app_id}.conversations")
        changelog = await read_topic(self.bootstrap, f"{self.app_id}-conversation_state-changelog")
        last_event: dict[str, int] = {}
        for record in events:
            if CONVERSATION_KEY.match(record.key):  # not the configuration markers
                last_event[record.key] = max(last_event.get(record.key, -1), record.offset)
        applied: dict[str, int] = {}
        for record in sorted(changelog, key=lambda r: r.offset):
            if isinstance(record.value, dict):
                applied[record.key] = int(record.value.get("offset", -1))
        behind = {key for key, offset in last_event.items() if applied.get(key, -1) < offset}
        return not behind

    async def no_calls_held(self) -> bool:
        """No Chatwoot call still held by the sandbox (a slow mutation): one whose run was cut off (its conversation
        forgotten) still takes effect when the hold ends, and its webhook comes after the router looks done."""
        log = await self.control("GET", "/log?include=api_calls")
        return not any(call.get("status") is None for call in log["api_calls"])

    async def settle(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                proc.start()

        async def all_healthy() -> bool:  # the supervisor restarts what exits meanwhile
            return all([proc.alive() and await self.healthy(proc) for proc in self.procs])

        healthy = await wait_for(all_healthy, 180, every_s=0.5)
        self.note("every process healthy" if healthy else "not every process healthy within 180 s; going on")
        with contextlib.suppress(RuntimeError):
            await self.control("POST", "/settle", {"timeout_s": 60})
        self.note("settled" if await self.wait_quiet(120) else "not quiet within 120 s; sweeping anyway")
        sweep = await asyncio.to_thread(self.run_cli, "sweep")
        self.note("operator sweep requested", code=sweep.returncode, stderr=sweep.stderr.strip()[-300:])
        deadline = time.monotonic() + self.o.settle_deadline_s

        async def done() -> bool:
            return await self.all_ended() and await self.no_calls_held() and await self.wait_quiet(QUIET_S * 4)

        ended = await wait_for(done, self.o.settle_deadline_s, every_s=1.0)
        self.note(
            "every conversation ended, no call held"
            if ended
            else "not every conversation ended (or a call still held) by the deadline"
        )
        folded = await wait_for(self.all_folded, max(30.0, deadline - time.monotonic()), every_s=2.0)
        self.note("every record folded" if folded else "some records not folded by the deadline")

    def coverage(self) -> dict[str, int]:
        """How much of the plan happened: people act only when the conversation is in the state they need."""
        notes = [note for plan in self.plans for note in plan.notes]
        return {
            "second_messages": sum(1 for p in self.plans if p.second_after_s is not None),
            "faults_planned": sum(1 for p in self.plans if p.fault is not None),
            "taken_over_while_pending": sum(1 for n in notes if n.startswith("taken over")),
            "takeovers_skipped": sum(1 for n in notes if n.startswith("takeover skipped")),
            "edited_after_end": sum(1 for p in self.plans if any(n.startswith("edited") for n in p.notes)),
            "edits_skipped": sum(1 for n in notes if n.startswith("edits skipped")),
            "play_failures": sum(1 for n in notes if n.startswith("play failed")),
            **self.forget_coverage(),
        }

    def forget_coverage(self) -> dict[str, int]:
        """How the forgets went: while pending or after the end, how many `forget` runs failed, and how many ran
        while a kill (or a broker stop) happened."""
        forgets = [p.forget for p in self.plans if p.forget is not None]
        if not forgets:
            return {}
        chaos = [e["t"] for e in self.timeline if e["what"].startswith(("kill ", "broker stop", "pause "))]
        attempts = [a for f in forgets for a in f["attempts"]]
        return {
            "forgets": len(forgets),
            **{f"forgets_{when}": n for when, n in sorted(Counter(f["when"] for f in forgets).items())},
            "forgets_while_pending": sum(1 for f in forgets if f["pending"]),
            "forgets_after_end": sum(1 for f in forgets if not f["pending"]),
            "forget_runs": len(attempts),
            "forget_runs_failed": sum(1 for a in attempts if a["code"] != 0),
            "forget_runs_across_a_kill": sum(
                1 for a in attempts if any(a["start_s"] <= t <= a["end_s"] for t in chaos)
            ),
            "forget_run_max_s": round(max((a["end_s"] - a["start_s"] for a in attempts), default=0.0)),
        }

    def annotate_late_folds(self, verdict: Verdict, evidence: Evidence) -> None:
        """Name the kills and broker stops between a late webhook's write and its fold (wall clock)."""
        written = {(r.key, r.offset): r.timestamp_ms / 1000 for r in evidence.events}
        for late in verdict.info.get("late_folds", []):
            at = written.get((late["conversation"], late["offset"]))
            if at is None:
                continue
            late["written_at_run_s"] = round(at - (self.timeline[0]["wall"] - self.timeline[0]["t"]), 1)
            late["chaos_before"] = [
                f"{e['what']} {e.get('process', '')} at {e['t']:.1f}s".strip()
                for e in self.timeline
                if ("kill" in e["what"] or "broker" in e["what"]) and at - 20 <= e["wall"] <= at + late["lag_s"]
            ]

    def run_cli(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streams.cli", *args],
            cwd=self.o.code_dir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    # --- the run ---

    async def run(self) -> Result:
        stop = asyncio.Event()
        self.http = httpx.AsyncClient(timeout=30)
        try:
            await self.start_stack()
            supervisor = asyncio.create_task(self.supervise(stop))
            self.note("playing", conversations=len(self.plans), play_s=round(self.o.play_s, 1), kills=self.o.kills)
            await asyncio.gather(self.play(), self.kill_loop(), self.broker_loop(), self.pause_loop())
            self.note("play over")
            await self.settle()
            stop.set()
            await supervisor
            audit_run = await asyncio.to_thread(self.run_cli, "audit", "--verify")
            audit = parse_audit(audit_run.returncode, audit_run.stdout + audit_run.stderr)
            self.note("audit --verify", code=audit_run.returncode, summary=audit.summary)
            evidence = await collect(
                sandbox_url=self.sandbox_url,
                bootstrap=self.bootstrap,
                app_id=self.app_id,
                scope=[p.key for p in self.plans if p.conversation_id is not None],
                bot_ids=BOT_IDS,
                audit=audit,
                tags={p.tag: p.key for p in self.plans},
                plans={p.key: p.kind for p in self.plans},
                forgets={p.key: p.forget for p in self.plans if p.forget is not None},
            )
            (self.work / "evidence.json").write_text(json.dumps(evidence.to_json(), default=str))
            verdict = check(evidence)
            verdict.info["plans"] = [asdict(p) for p in self.plans]
            verdict.info["coverage"] = self.coverage()
            self.annotate_late_folds(verdict, evidence)
            return Result(
                self.o,
                verdict,
                self.now(),
                self.timeline,
                self.work,
                self.app_id,
                self.broker_restarts,
                self.self_exits,
                self.starts_again(),
                self.fail_stops(),
            )
        finally:
            stop.set()
            await self.http.aclose()
            self.stop_stack()
            if self.proxy is not None:
                await self.proxy.stop()


def code_version(code_dir: Path) -> str:
    """The commit the router ran from, "+ changes in …" when its tree differs ("not a git tree" otherwise)."""
    exported = code_dir / "COMMIT"  # written next to a `git archive` export
    if exported.exists():
        return f"{exported.read_text().strip()} (exported to {code_dir})"
    git = ["git", "-C", str(code_dir)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return f"{code_dir} (not a git tree)"
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=False)
    changed = [
        line[3:]
        for line in status.stdout.splitlines()
        if line[3:].startswith(("streams/", "handlers/", "projections/", "schemas/"))
    ]
    return head.stdout.strip() + (f" + changes in {', '.join(changed)}" if changed else "")


async def wait_for(check: Callable[[], Awaitable[bool]], deadline_s: float, every_s: float = 0.5) -> bool:
    """Poll `check` until it is true (True) or the deadline passes (False)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if await check():
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)  # the polling interval of a condition bounded by its deadline


def run_chaos(options: Options, bootstrap: str | None = None) -> Result:
    """Run one chaos test and return its result (the verdict, the timeline, where the logs are)."""
    return asyncio.run(Chaos(options, bootstrap).run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--broker-restarts", type=int, default=0)
    parser.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="3: run on a local three-node cluster; each broker restart stops a random one of the three",
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds of play (default 1.5 per conversation)")
    parser.add_argument("--fault-rate", type=float, default=0.3, help="share of conversations with one fault")
    parser.add_argument("--settle-deadline", type=float, default=240.0, help="seconds to wait after the sweep")
    parser.add_argument("--json", type=Path, default=None, help="write the whole report here")
    parser.add_argument("--work-dir", type=Path, default=None, help="logs and data (default: a new temp dir)")
    parser.add_argument(
        "--code-dir",
        type=Path,
        default=ROOT,
        help="run the router (ingress, workers, sweep, audit) from this source tree, e.g. an exported commit; "
        "the sandbox and the verifier stay this tree's",
    )
    parser.add_argument(
        "--no-worker-ids",
        action="store_true",
        help="start the workers without ROUTER_WORKER_ID (dynamic group membership: every restart rebalances)",
    )
    parser.add_argument(
        "--pauses", type=int, default=0, help="freeze a random worker this often for 20-40 s (SIGSTOP, SIGCONT)"
    )
    parser.add_argument(
        "--pause-in-recovery",
        action="store_true",
        help="each pause restarts its worker first and freezes it while it recovers the partitions it was given",
    )
    parser.add_argument(
        "--slow-broker-ms",
        type=int,
        default=0,
        help="clients reach the broker through a proxy that delays every byte this long each way (a slow leader)",
    )
    parser.add_argument(
        "--slow-mutation-rate",
        type=float,
        default=0.0,
        help="share of conversations with one mutation Chatwoot answers only after 20 s (partitions move meanwhile)",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL brokers with ACLs (`kafka --secure`): the ingress, the workers and the rest each under its role",
    )
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="the sandbox in --realistic mode: Chatwoot's rate limit, webhooks concurrent, reordered and duplicated",
    )
    parser.add_argument(
        "--forget-rate",
        type=float,
        default=0.0,
        help="share of conversations forgotten meanwhile with `chatwoot-router forget` (issue 32), mid-route or after",
    )
    parser.add_argument("--clean", action="store_true", help="remove the work directory after a passing run")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None
    if bootstrap and (args.broker_restarts or args.brokers > 1 or args.slow_broker_ms):
        print(
            "--broker-restarts, --brokers and --slow-broker-ms need the test's own Kafka: "
            "unset KAFKA_BOOTSTRAP_SERVERS",
            file=sys.stderr,
        )
        return 2
    if args.secure and (bootstrap or args.slow_broker_ms):
        print("--secure needs the test's own Kafka (no KAFKA_BOOTSTRAP_SERVERS, no --slow-broker-ms)", file=sys.stderr)
        return 2
    if args.slow_broker_ms and args.brokers > 1:
        print("--slow-broker-ms works with one broker", file=sys.stderr)
        return 2
    options = Options(
        conversations=args.conversations,
        kills=args.kills,
        seed=args.seed if args.seed is not None else random.randrange(1_000_000),
        workers=args.workers,
        partitions=args.partitions,
        broker_restarts=args.broker_restarts,
        brokers=args.brokers,
        duration_s=args.duration,
        fault_rate=args.fault_rate,
        json_path=args.json,
        work_dir=args.work_dir,
        settle_deadline_s=args.settle_deadline,
        code_dir=args.code_dir.resolve(),
        worker_ids=not args.no_worker_ids,
        pauses=args.pauses,
        pause_in_recovery=args.pause_in_recovery,
        slow_broker_ms=args.slow_broker_ms,
        slow_mutation_rate=args.slow_mutation_rate,
        realistic=args.realistic,
        secure=args.secure,
        forget_rate=args.forget_rate,
    )
    try:
        result = run_chaos(options, bootstrap)
    except StackFailed as exc:
        print(f"chaos: seed={options.seed} the stack failed: {exc}", file=sys.stderr)
        return 2
    report = result.verdict.report()
    if report:
        print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2, default=str))
    print(result.summary(), flush=True)
    if result.verdict.passed and args.clean:
        shutil.rmtree(result.work_dir, ignore_errors=True)
    return 0 if result.verdict.passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the children on SIGTERM too
    sys.exit(main())
