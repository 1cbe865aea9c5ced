"""A burst of new conversations against Chatwoot's real rate limit (issue 30 "Measured").

For each case it starts a fresh stack on one broker (`tests/support/stack.py`: the sandbox in `--realistic` mode
with Chatwoot's limit of 3,000 requests a minute per IP, the ingress, one or two workers), creates `--conversations`
new conversations at once, each with a billing question, and waits until every one is assigned to its owner. It
reports, per case:

- routed: conversations assigned to their owner; handed off: conversations that ended with people instead;
- 429s: requests the sandbox refused for the rate limit;
- served: the Chatwoot requests the sandbox answered; floor: the least time those requests need at 3,000 a minute;
- seconds from the first conversation created to the last one routed, and its ratio to the floor.

Cases: the default budget (`ROUTER_CHATWOOT_REQUESTS_PER_MIN` 2,400) with one worker and with two (each takes its
share of the partitions), and a budget set above the limit (6,000) so the router meets 429s: nothing may be handed
off for them either.

    .venv/bin/python bench/burst_bench.py [--conversations 300] [--only default-1,default-2,over-limit]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.kafka.local import free_port, start_broker  # noqa: E402
from tests.support.processes import Process  # noqa: E402
from tests.support.stack import BILLING, Stack  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

LIMIT_PER_MIN = 3000
QUESTION = "I was charged twice on my invoice, please refund the payment"
CASES = {
    "default-1": {"workers": 1, "budget": 2400},
    "default-2": {"workers": 2, "budget": 2400},
    "over-limit": {"workers": 1, "budget": 6000},
}


def run_case(bootstrap: str, work: Path, name: str, workers: int, budget: int, conversations: int) -> dict[str, Any]:
    case_dir = work / name
    case_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(
        bootstrap,
        f"burst-{name}-{os.getpid()}-{int(time.time())}",
        case_dir,
        sandbox_args=["--realistic", "--rate-limit", str(LIMIT_PER_MIN), "--seed", "11"],
        env={"ROUTER_CHATWOOT_REQUESTS_PER_MIN": str(budget), "ROUTER_PARTITIONS": "12"},
    )
    extra: list[Process] = []
    try:
        stack.start()
        for n in range(2, workers + 1):
            worker = Process(f"worker-{n}", ["worker", "--web-port", str(free_port())], stack.env, case_dir)
            worker.start()
            extra.append(worker)
        calls_before = len(stack.state()["api_calls"])
        started = time.monotonic()
        created = []
        for _ in range(conversations):
            conversation = stack.new_conversation()
            stack.customer_says(1, conversation, QUESTION)
            created.append(conversation)
        pending = set(created)
        ended: dict[int, dict[str, Any]] = {}

        def all_ended() -> bool:
            for conversation in list(pending):
                found = stack.conversation(1, conversation)
                if found["status"] != "pending":
                    ended[conversation] = found
                    pending.discard(conversation)
            return not pending

        wait_until("every conversation routed", all_ended, 1800, 2.0)
        seconds = time.monotonic() - started
        state = stack.state()
        calls = state["api_calls"][calls_before:]
        throttled = sum(1 for c in calls if c.get("status") == 429)
        served = len(calls) - throttled
        routed = sum(1 for c in ended.values() if c.get("assignee_id") == BILLING)
        floor_s = served / (LIMIT_PER_MIN / 60)
        result = {
            "case": name,
            "workers": workers,
            "budget_per_min": budget,
            "conversations": conversations,
            "routed": routed,
            "handed_off": conversations - routed,
            "throttled_429": throttled,
            "served_requests": served,
            "floor_s": round(floor_s, 1),
            "seconds": round(seconds, 1),
            "ratio_to_floor": round(seconds / floor_s, 2) if floor_s else None,
        }
        print(json.dumps(result), flush=True)
        return result
    finally:
        for worker in extra:
            worker.stop()
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases: " + ", ".join(CASES))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="burst-bench-") as temporary:
        work = Path(temporary)
        broker = start_broker(None, work / "kafka")
        try:
            results = [
                run_case(broker.bootstrap, work, name, conversations=args.conversations, **CASES[name])
                for name in args.only.split(",")
            ]
        finally:
            broker.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
