"""Record the `config-change` golden history: the sandbox's scenarios routed live, a configuration applied in the
middle, more routed after it (DESIGN §8 "Golden histories").

Runs the real stack (sandbox, ingress, worker; a local broker unless `--bootstrap` is given), routes a spam
conversation, a billing question, an opening-hours question (the canned reply), a "Hello" with no request yet,
a question whose reads fail once (a retry) and one whose reads keep failing (handoff mode); then
`config apply`s a change (spam is snoozed instead of resolved, sales loses its owner) and routes spam, a billing
and a sales question again. Each conversation's log, with its partition's `ConfigApplied` markers, and the
configuration versions are written to `--out`, a new directory (`tests/golden/config-change` was recorded this way
and, like every recorded history, is never re-recorded: see `tests/golden/histories.py`); then the new files are
sealed into the manifest and the expected files are regenerated.

    .venv/bin/python -m tests.golden.config_change --out tests/golden/NAME [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.golden.histories import record, regenerate, seal
from tests.support.stack import Stack, router_config

SPAM = "Casino spam advertising: unsolicited marketing offers for you"
BILLING = "I was charged twice on my invoice, please refund the payment"
SALES = "Can I get a sales quote and pricing plans for a discount?"
HOURS = "What are your opening hours? When is the shop open or closed?"


def route(stack: Stack, text: str, done: str = "not pending", **fault: object) -> int:
    """One customer message in a new conversation, routed until the router has ended its turn."""
    conversation = stack.new_conversation()
    if fault:
        stack.fault(account_id=1, conversation_id=conversation, **fault)
    stack.customer_says(1, conversation, text)
    stack.wait_conversation(1, conversation, done, lambda c: c["status"] != "pending", deadline_s=90)
    return conversation


def drive(stack: Stack, tmp: Path) -> None:
    route(stack, SPAM)
    route(stack, BILLING)
    route(stack, HOURS)
    hello = stack.new_conversation()
    stack.customer_says(1, hello, "Hello")
    stack.customer_says(1, hello, BILLING)
    stack.wait_conversation(1, hello, "routed", lambda c: c["status"] != "pending", deadline_s=90)
    route(stack, BILLING, op="list_messages", mode="fail", status=503, times=1)
    route(stack, BILLING, op="list_messages", mode="fail", status=503, times=3)

    changed = router_config(stack.sandbox_url)
    changed["routing"]["kinds"]["1"]["spam"]["status"] = "snoozed"
    del changed["routing"]["accounts"]["1"]["sales"]
    path = tmp / "changed.json"
    path.write_text(json.dumps(changed))
    applied = stack.run_cli("config", "apply", str(path))
    if applied.returncode != 0:
        raise SystemExit(f"config apply failed: {applied.stderr}")

    route(stack, SPAM)
    route(stack, BILLING)
    route(stack, SALES)


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from streams.kafka.local import running_broker

    with running_broker(data_dir=Path(tempfile.mkdtemp(prefix="golden-broker-"))) as running:
        yield running.bootstrap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=None, help="a running broker (default: start a local one)")
    parser.add_argument("--out", type=Path, required=True, help="a new directory under tests/golden")
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"{args.out} is not empty: recorded histories are never re-recorded")
    app_id = f"golden-{uuid.uuid4().hex[:8]}"
    with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        stack = Stack(bootstrap, app_id, Path(tmp))
        stack.start()
        try:
            drive(stack, Path(tmp))
        finally:
            stack.stop()
        count = asyncio.run(record(bootstrap, app_id, args.out))
    seal()
    regenerate()
    print(f"recorded {count} conversations into {args.out}, sealed them and regenerated the expected files")


if __name__ == "__main__":
    main()
