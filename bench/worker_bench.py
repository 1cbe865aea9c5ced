"""Worker benchmark (not run by CI): webhook -> turn end through sandbox, ingress, Kafka and the worker.

Starts the same stack as the end-to-end tests (`chatwoot-router sandbox`, `ingress`, `worker` as processes),
with the sandbox answering every Chatwoot call after 20 ms and System One after 200 ms, then:

1. baseline: N billing questions sent back to back; conversations/s and p50/p99 of webhook -> turn end;
2. isolation: the same, with the *first* conversation's System One call taking 30 s; the others' p99 must
   stay within 1.5x the baseline (a slow call delays only its own conversation, DESIGN §7).

"Turn end" is the time of the worker's `turn assigned` log line for the conversation (same machine clock as
the send time taken just before the message is posted).

    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:9092 [--conversations 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import Stack, wait_until  # the e2e tests' stack, reused as is

CHATWOOT_OPS = (
    "get_conversation",
    "list_conversations",
    "list_messages",
    "create_message",
    "toggle_status",
    "assign",
    "set_labels",
    "get_labels",
    "get_inbox_bot",
    "list_canned",
    "list_agents",
)
QUESTION = "I was charged twice on my invoice, please refund the payment"


def turn_ends(log_path: Path) -> dict[str, float]:
    """Conversation key -> epoch seconds of its first `turn assigned` log line."""
    ends: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if '"turn assigned"' not in line:
            continue
        entry = json.loads(line)
        ends.setdefault(entry["key"], datetime.fromisoformat(entry["time"]).timestamp())
    return ends


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_batch(stack: Stack, count: int, slow_first: bool) -> dict[str, float]:
    """Send `count` questions; with `slow_first` the first one's System One call is the slow one."""
    ids = [stack.new_conversation() for _ in range(count)]
    sent: dict[str, float] = {}
    for conversation in ids:
        sent[f"1:{conversation}"] = time.time()
        stack.customer_says(1, conversation, QUESTION)
    others = [f"1:{c}" for c in (ids[1:] if slow_first else ids)]
    wait_until("every turn to end", lambda: set(others) <= set(turn_ends(stack.worker.log_path)), 600, 0.5)
    ends = turn_ends(stack.worker.log_path)
    latencies = [ends[k] - sent[k] for k in others]
    span = max(ends[k] for k in others) - min(sent[k] for k in others)
    if slow_first:
        first = f"1:{ids[0]}"
        wait_until("the slow conversation", lambda: first in turn_ends(stack.worker.log_path), 120, 0.5)
    return {
        "conversations_per_s": len(others) / span,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * percentile(latencies, 0.99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--keep", help="keep the processes' logs and state in this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        stack = Stack(args.bootstrap, f"bench-{int(time.time())}", Path(tmp))
        stack.start()
        try:
            stack.fault(op="systemone", mode="delay", delay_ms=200, times=None)
            for op in CHATWOOT_OPS:
                stack.fault(op=op, mode="delay", delay_ms=20, times=None)
            base = run_batch(stack, args.conversations, slow_first=False)
            # the 30 s rule must be found first: put it in front of the standing 200 ms rule
            stack.clear_faults()
            stack.fault(op="systemone", mode="delay", delay_ms=30_000, times=1)
            stack.fault(op="systemone", mode="delay", delay_ms=200, times=None)
            for op in CHATWOOT_OPS:
                stack.fault(op=op, mode="delay", delay_ms=20, times=None)
            slow = run_batch(stack, args.conversations, slow_first=True)
        finally:
            stack.stop()
    print(
        f"baseline:  {base['conversations_per_s']:.1f} conversations/s, p50 {base['p50_ms']:.0f} ms, "
        f"p99 {base['p99_ms']:.0f} ms"
    )
    print(
        f"one slow:  {slow['conversations_per_s']:.1f} conversations/s, p50 {slow['p50_ms']:.0f} ms, "
        f"p99 {slow['p99_ms']:.0f} ms (others; ratio {slow['p99_ms'] / base['p99_ms']:.2f}x baseline p99)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
