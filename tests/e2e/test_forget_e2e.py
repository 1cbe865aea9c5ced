"""Erasure by crypto-shredding (issue 32 item 3), end to end on the shared stack.

`forget` destroys a conversation's data key: the latest value of its key on `<app>.keys` becomes the erasure fence,
a `Forgotten` record on the log is the proof, the conversation is never routed again, and `audit` still tells
what the router did while showing its text as erased. `forget --contact` finds a contact's conversations by the
contact id kept beside each data key."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from tests.support.kafka import read_all
from tests.support.stack import SALES, Stack
from tests.support.trail import last_seq, sandbox_calls


def routed(stack: Stack, text: str, **fields: object) -> int:
    conversation = stack.new_conversation(**fields)
    stack.customer_says(1, conversation, text)
    stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
    stack.log.wait_settled(1, conversation, "its turn to end")
    return conversation


def latest_keys(stack: Stack) -> dict[str, dict[str, object]]:
    app, bootstrap = stack.env["ROUTER_APP_ID"], stack.env["KAFKA_BOOTSTRAP_SERVERS"]
    latest: dict[str, dict[str, object]] = {}
    for record in asyncio.run(read_all(bootstrap, f"{app}.keys")):
        value = json.loads(record.value)
        latest[value["key"]] = value
    return latest


def test_a_forgotten_conversation_keeps_its_history_loses_its_text_and_is_never_routed_again(
    e2e: Stack, tmp_path: Path
) -> None:
    marker = f"pangolin{uuid.uuid4().hex[:6]}"
    conversation = routed(e2e, f"I need a quote for your pricing plans {marker}")
    key = f"1:{conversation}"
    opened = e2e.run_cli("audit", "--conversation", key, "--html", str(tmp_path / "before.html"))
    assert opened.returncode == 0 and marker in (tmp_path / "before.html").read_text()  # the KEK opens it
    keys = latest_keys(e2e)
    assert key in keys and keys[key]["type"] == "data_key", list(keys.items())[:3]

    done = e2e.run_cli("forget", "--conversation", key, "--reason", "the customer asked (ticket 77)")
    assert done.returncode == 0, done.stderr
    assert f"forgotten {key} at " in done.stdout and "compacted away by" in done.stdout

    fence = latest_keys(e2e)[key]
    assert fence["type"] == "erased" and fence["reason"] == "the customer asked (ticket 77)"
    assert "wrapped" not in fence  # no key material left in its latest value
    seen = e2e.log.wait(1, conversation, "forgotten", lambda s: s.trail.state.forgotten_ms is not None)
    assert seen.trail.state.run is None and seen.trail.state.job is None

    before = last_seq(e2e)
    after = seen.last_offset
    e2e.customer_says(1, conversation, "hello again, any news?")
    e2e.settle()
    e2e.log.wait_settled(1, conversation, "the new webhook folded", after=after)
    assert sandbox_calls(e2e, conversation, since_seq=before) == []  # not read, not routed: never touched again

    audit = e2e.run_cli("audit", "--conversation", key, "--html", str(tmp_path / "after.html"))
    assert audit.returncode == 0, audit.stderr
    assert "forgotten" in audit.stdout and "sales" in audit.stdout  # what the router did is still told
    page = (tmp_path / "after.html").read_text()
    assert marker not in page and "erased" in page  # its text is gone, even with the KEK


def test_forget_by_contact_erases_every_conversation_of_the_contact(e2e: Stack) -> None:
    first = routed(e2e, "I need a quote for your pricing plans", contact_name="Quentin Marsh")
    contact = e2e.conversation(1, first)["contact"]["id"]
    second = routed(e2e, "and a quote for the enterprise plan too", contact_id=contact)
    other = routed(e2e, "I need a quote for your pricing plans", contact_name="Someone Else")

    done = e2e.run_cli("forget", "--contact", f"1:{contact}", "--reason", "erasure request")
    assert done.returncode == 0, done.stderr
    keys = latest_keys(e2e)
    assert keys[f"1:{first}"]["type"] == keys[f"1:{second}"]["type"] == "erased"
    assert keys[f"1:{other}"]["type"] == "data_key"  # another contact's conversation is untouched


def test_forget_refuses_bad_arguments_in_one_line(e2e: Stack) -> None:
    bad = e2e.run_cli("forget", "--conversation", "12", "--reason", "x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "ACCOUNT:ID" in bad.stderr
