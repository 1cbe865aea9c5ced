"""The kill-loop test's verifier (issue 15), independent of the router's code paths.

It judges a chaos run from what the outside world saw, never by re-running the router's fold:

- the sandbox's request log (`GET /_sandbox/log`): every Chatwoot API call with its order (`seq` on arrival,
  `applied_seq` when it took effect), the conversation's fields before and after it, the fault that fired;
  every customer and person action through the control API in the same order; every webhook delivery with
  each attempt's status and answer; every System One call;
- the sandbox's final state (`GET /_sandbox/state`): status, assignee, bot assignment and messages;
- the raw Kafka topics, read with a bare aiokafka consumer and decoded as plain JSON: `<app>.conversations`
  (the event log), `<app>-conversation_state-changelog` (every state the workers wrote, each with the offset of
  the event it last applied) and `<app>.effects`;
- the exit status and output of `chatwoot-router audit --verify` (the router's own replay; reported, not
  trusted for anything else).

Checks (each failure is a `Violation` naming the conversation, the requests and the offsets involved):

- `duplicates`: a conversation with more than one brand-bot reply (final messages, or applied
  `create_message` calls).
- `stale_mutations`: a router mutation (labels, status, assign/unassign with the bot token) that took effect
  after a person's change on that conversation and undid it (moved a field the person set away from the
  person's value, or removed a label the person added). Such a mutation is only the race behavior.md §12.1
  allows ("a human change racing a mutation cannot be fully excluded") when the router's last fresh read
  (`get_conversation`) before it came *before* the person's change and it is not a repeat of an identical
  mutation already applied earlier in the same turn; those are reported under `raced` and do not fail a run.
- `late_mutations`: any router mutation or reply (bot token) that took effect after a person's takeover or
  edit of that conversation while the router's last fresh read came before the person's action, whatever it
  changed (issue 22): the router acted on a conversation that was no longer its own. A customer message that
  gives the conversation back to the bot ends what the people's actions before it stand for.
- `unfolded`: a webhook the ingress acknowledged (2xx, not "ignored") that is not on `<app>.conversations`,
  or whose record was never applied: no state in the changelog carries its offset (the workers write one
  state per applied event) or the key's last state is behind it.
- `skipped_records`: any record of `<app>.conversations` (webhook, sweep row, outcome, timer) whose offset
  no state of its key carries, although the key's last state is past it or the record is the key's last.
- `unended`: a conversation of the run still pending, or still assigned to the bot, at the end.
- `audit_differences`: what `audit --verify` reports (or -1 when it could not run).
- `wrong_tokens`: a mutation made without the bot token, or a read without the user token.
- `forget_incomplete`, `mutated_after_forgotten`, `keys_not_fenced` (issue 32, `--forget-rate`): a conversation
  the run forgot (`chatwoot-router forget`) with no `Forgotten` record on `<app>.conversations`, or whose `forget`
  never exited 0; a router call with the bot token (a mutation or a reply) that reached Chatwoot after the
  `Forgotten` record's `at_ms` (the worker stamps it after it put the fence in place and cancelled the
  conversation's lane and waited for it, so a call that arrives later was made after the erasure; one that arrived
  before and took effect after is the in-flight call the cancellation cut off, `in_flight_at_forget`, information);
  a forgotten conversation whose latest record on `<app>.keys` is not the erasure fence, or with a data key
  written after its fence. A forgotten conversation is never routed again, so it is not `unended`.

Informational (never fail a run): `stale_reads` (how often a worker did not make a mutation because its fresh
read was older than ROUTER_FRESH_READ_MS, or its partition had not caught up: `stale_read` outcomes); `raced`
(also counted by `late_mutations`); `repeated_mutations` (an identical router mutation applied again in the same
turn: a command executed twice, whether or not a person noticed); `late_folds` (acknowledged webhooks
first applied more than 30 s after they were written; `fold_lag_s` has the max, p50 and p99); `jev_repeats`
(the same System One input answered 2xx more than once, against Decisions 2);
`reads_after_forgotten` and `systemone_after_forgotten` (calls for a forgotten conversation that arrived after its
`Forgotten` record: reads, and System One requests carrying its tag); `in_flight_at_forget` (see above);
`applied_without_own_changelog_entry` (a record whose state a SIGKILLed worker wrote to its local RocksDB but not to
the changelog, continued from by the same worker restarted on its data dir: counted as skipped only when
`audit --verify` finds the key's state differs from a full replay); `effects_reissued` (command ids
written to `<app>.effects` more than once); the final endings by scenario kind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from handlers.kafka.security import client_options
from schemas.records import GENERATION_HEADER

MUTATIONS = ("toggle_status", "assign", "set_labels")
BOT_OPS = frozenset({*MUTATIONS, "create_message"})
USER_OPS = frozenset(
    {"get_conversation", "list_messages", "get_inbox_bot", "list_conversations", "conversations_meta"}
    | {"list_canned", "list_agents"}
)
OWNED_FIELDS = ("status", "assignee_id")
LATE_FOLD_S = 30.0  # twice the workers' session timeout: a webhook applied later than this is reported
PERSON_ACTIONS = frozenset({"status", "assign", "labels"})
CONVERSATION_KEY = re.compile(r"^\d+:\d+$")
_PATH = re.compile(r"^/api/v1/accounts/(\d+)/conversations/(\d+)(?:/|$)")


@dataclass(frozen=True)
class Record:
    """One Kafka record, its value decoded as JSON (None for a tombstone, {"_raw": …} when not JSON)."""

    partition: int
    offset: int
    key: str
    value: Any
    timestamp_ms: int = 0  # the broker's record timestamp (when it was produced)
    generation: int | None = None  # a changelog record's `router-generation` header: the writer's group generation


@dataclass
class AuditResult:
    returncode: int
    differences: list[str]
    summary: str


@dataclass
class Evidence:
    """Everything the checks read; `scope` = the run's conversations ("account:conversation")."""

    scope: list[str]
    bot_ids: dict[int, int]
    api_calls: list[dict[str, Any]]
    person_actions: list[dict[str, Any]]
    webhooks: list[dict[str, Any]]
    systemone_calls: list[dict[str, Any]]
    conversations: dict[str, dict[str, Any]]
    events: list[Record]
    changelog: list[Record]
    effects: list[Record]
    audit: AuditResult | None = None
    tags: dict[str, str] = field(default_factory=dict)  # a word unique to each conversation's text -> key
    plans: dict[str, str] = field(default_factory=dict)  # key -> scenario kind, for the endings table
    keys: list[Record] = field(default_factory=list)  # `<app>.keys`: data keys and erasure fences (issue 32)
    # key -> the run's `forget` of it: {"when", "asked_at_s", "attempts": [{"code", …}], "confirmed"} (--forget-rate)
    forgets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evidence:
        fields = dict(data)
        for name in ("events", "changelog", "effects", "keys"):
            fields[name] = [Record(**r) for r in data.get(name, [])]
        fields["bot_ids"] = {int(k): v for k, v in data["bot_ids"].items()}
        fields["audit"] = AuditResult(**data["audit"]) if data.get("audit") else None
        return cls(**fields)


@dataclass
class Violation:
    check: str
    conversation: str | None
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        where = f" {self.conversation}" if self.conversation else ""
        return f"[{self.check}]{where}: {self.detail}"


COUNTED = ("duplicates", "stale_mutations", "late_mutations", "unfolded", "unended", "audit_differences")
EXTRA = ("skipped_records", "wrong_tokens")
FORGET_CHECKS = ("forget_incomplete", "mutated_after_forgotten", "keys_not_fenced")


@dataclass
class Verdict:
    counts: dict[str, int]
    violations: list[Violation]
    info: dict[str, Any]

    @property
    def passed(self) -> bool:
        return not self.violations and self.counts.get("audit_differences", 0) == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "counts": self.counts,
            "violations": [asdict(v) for v in self.violations],
            "info": self.info,
        }

    def report(self, limit: int = 60) -> str:
        """The violations, one line each (at most `limit`), then the informational findings."""
        lines = [v.line() for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"… and {len(self.violations) - limit} more violations")
        for raced in self.info.get("raced", [])[:10]:
            lines.append(f"[raced, allowed by §12.1] {raced['conversation']}: {raced['detail']}")
        for repeat in self.info.get("repeated_mutations", [])[:10]:
            lines.append(
                f"[info: executed again] {repeat['conversation']}: {repeat['call']} {repeat['after_s']}s after "
                f"seq={repeat['first_seq']}"
            )
        for late in self.info.get("late_folds", [])[:10]:
            context = ""
            if "written_at_run_s" in late:  # added by bench.chaos, absent when evidence is re-checked alone
                context = f" (written at {late['written_at_run_s']}s; {'; '.join(late.get('chaos_before', []))})"
            lines.append(
                f"[info: late fold] {late['conversation']}: {late['event']} at partition {late['partition']} offset "
                f"{late['offset']} applied {late['lag_s']}s after it was written{context}"
            )
        for line in self.info.get("applied_without_own_changelog_entry", [])[:10]:
            lines.append(f"[info: state only in a restarted worker's local store] {line}")
        if self.info.get("coverage"):
            lines.append(f"[info] plan coverage: {self.info['coverage']}")
        forgetting = self.info.get("forgetting") or {}
        for line in forgetting.get("in_flight_at_forget", [])[:10]:
            lines.append(f"[info: in flight when forgotten] {line}")
        if forgetting.get("forgets"):
            lines.append(f"[info] forgotten: {forgetting['moments']} (as Chatwoot saw each at its Forgotten record)")
        if forgetting.get("reads_after_forgotten"):
            lines.append(f"[info] reads after a Forgotten record: {forgetting['reads_after_forgotten'][:10]}")
        if forgetting.get("systemone_after_forgotten"):
            lines.append(f"[info] System One asked after a Forgotten record: {forgetting['systemone_after_forgotten']}")
        if self.info.get("jev_repeats"):
            lines.append(f"[info] System One answered the same input more than once: {self.info['jev_repeats']}")
        return "\n".join(lines)


# --- the checks ------------------------------------------------------------------------------------------


def key_of_path(path: str) -> str | None:
    match = _PATH.match(path)
    return f"{match.group(1)}:{match.group(2)}" if match else None


def _by_key(calls: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        key = key_of_path(call.get("path", ""))
        if key is not None:
            grouped[key].append(call)
    return grouped


def _call_text(call: dict[str, Any]) -> str:
    body = json.dumps(call.get("body"), separators=(",", ":")) if "body" in call else ""
    fault = f" fault={call['fault']}" if call.get("fault") else ""
    return f"{call['op']} {body} seq={call.get('applied_seq', call.get('seq'))} status={call.get('status')}{fault}"


def check_duplicates(ev: Evidence, calls: dict[str, list[dict[str, Any]]]) -> list[Violation]:
    found = []
    for key in ev.scope:
        account = int(key.split(":")[0])
        conversation = ev.conversations.get(key) or {"messages": []}
        bot_id = ev.bot_ids.get(account)
        replies = [
            m
            for m in conversation["messages"]
            if m.get("message_type") == 1
            and (m.get("sender") or {}).get("type") == "agent_bot"
            and (bot_id is None or (m.get("sender") or {}).get("id") == bot_id)
        ]
        posted = [c for c in calls.get(key, []) if c["op"] == "create_message" and c.get("applied")]
        if len(replies) > 1 or len(posted) > 1:
            found.append(
                Violation(
                    "duplicates",
                    key,
                    f"{len(replies)} bot replies in Chatwoot, {len(posted)} create_message calls applied: "
                    + "; ".join(
                        f"seq={c['applied_seq']} at={c['applied_at']:.3f} status={c['status']}" for c in posted
                    ),
                    {"messages": [m.get("id") for m in replies], "calls": posted},
                )
            )
    return found


def _undone(
    owned: dict[str, tuple[Any, dict[str, Any]]],
    labels_added: dict[str, dict[str, Any]],
    labels_removed: dict[str, dict[str, Any]],
    call: dict[str, Any],
) -> list[tuple[str, dict[str, Any]]]:
    """What a router mutation undid of the people's changes: (description, the person action) pairs."""
    before, after = call.get("before"), call.get("after")
    if not before or not after:
        return []
    undone = []
    for name in (*OWNED_FIELDS, "bot_assignee_id"):
        if name in owned:
            value, action = owned[name]
            if before.get(name) == value and after.get(name) != value:
                undone.append((f"{name} {value!r} -> {after.get(name)!r}", action))
    for label, action in labels_added.items():
        if label in before.get("labels", []) and label not in after.get("labels", []):
            undone.append((f"removed label {label!r}", action))
    for label, action in labels_removed.items():
        if label not in before.get("labels", []) and label in after.get("labels", []):
            undone.append((f"re-added label {label!r}", action))
    return undone


def _timelines(
    ev: Evidence, calls: dict[str, list[dict[str, Any]]], ops: Iterable[str]
) -> Iterable[tuple[str, list[tuple[int, str, dict[str, Any]]]]]:
    """Per conversation in scope: its applied bot-token calls of `ops` ("mutation"), its successful
    `get_conversation` reads ("read") and the people's actions ("person"), in the sandbox's order."""
    wanted = frozenset(ops)
    actions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for action in ev.person_actions:
        actions[f"{action['account_id']}:{action['conversation_id']}"].append(action)
    for key in ev.scope:
        timeline: list[tuple[int, str, dict[str, Any]]] = []
        for call in calls.get(key, []):
            if "applied_seq" not in call or not call.get("applied"):
                continue
            if call["op"] in wanted and call.get("token") == "bot":
                timeline.append((call["applied_seq"], "mutation", call))
            elif call["op"] == "get_conversation" and 200 <= (call.get("status") or 0) < 300:
                timeline.append((call["applied_seq"], "read", call))
        timeline += [(a["seq"], "person", a) for a in actions.get(key, [])]
        timeline.sort(key=lambda item: item[0])
        yield key, timeline


def check_mutations(
    ev: Evidence, calls: dict[str, list[dict[str, Any]]]
) -> tuple[list[Violation], list[dict[str, Any]]]:
    """Router mutations that undid a person's change: stale ones (violations) and §12.1 races (info)."""
    stale: list[Violation] = []
    raced: list[dict[str, Any]] = []
    for key, timeline in _timelines(ev, calls, MUTATIONS):
        owned: dict[str, tuple[Any, dict[str, Any]]] = {}
        added: dict[str, dict[str, Any]] = {}
        removed: dict[str, dict[str, Any]] = {}
        last_read: dict[str, Any] | None = None
        turn_mutations: list[dict[str, Any]] = []  # router mutations applied since the bot last got the turn
        for _seq, kind, item in timeline:
            if kind == "read":
                last_read = item
            elif kind == "person":
                before, after = item["before"], item["after"]
                if item["action"] == "customer_message":
                    if after["status"] == "pending" and before["status"] != "pending":
                        owned.clear()  # Chatwoot gave the conversation back to the bot
                        added.clear()
                        removed.clear()
                        turn_mutations = []
                    for name in list(owned):
                        if before.get(name) != after.get(name):
                            owned[name] = (after.get(name), owned[name][1])
                    continue
                if item["action"] not in PERSON_ACTIONS:
                    continue
                for name in (*OWNED_FIELDS, "bot_assignee_id"):
                    if before.get(name) != after.get(name):
                        owned[name] = (after.get(name), item)
                for label in set(after["labels"]) - set(before["labels"]):
                    added[label] = item
                    removed.pop(label, None)
                for label in set(before["labels"]) - set(after["labels"]):
                    removed[label] = item
                    added.pop(label, None)
            else:
                undone = _undone(owned, added, removed, item)
                if undone:
                    person = max((action for _, action in undone), key=lambda a: a["seq"])
                    repeat = next(
                        (
                            m
                            for m in turn_mutations
                            if m["op"] == item["op"]
                            and m.get("body") == item.get("body")
                            and m["applied_seq"] < person["seq"]
                        ),
                        None,
                    )
                    read_before = last_read is not None and last_read["applied_seq"] < person["seq"]
                    detail = (
                        f"{_call_text(item)} at +{item['applied_at'] - person['at']:.2f}s after the person's "
                        f"{person['action']} {json.dumps(person['args'], separators=(',', ':'))} (seq={person['seq']}) "
                        f"undid: {', '.join(text for text, _ in undone)}; "
                        + (
                            f"last fresh read seq={last_read['applied_seq']} ({'before' if read_before else 'after'} "
                            f"the person's change)"
                            if last_read is not None
                            else "no fresh read before it"
                        )
                        + (
                            f"; repeats seq={repeat['applied_seq']} (+{item['applied_at'] - repeat['applied_at']:.2f}s)"
                            if repeat is not None
                            else ""
                        )
                    )
                    data = {"call": item, "person_action": person, "last_read": last_read, "repeat_of": repeat}
                    if read_before and repeat is None:
                        raced.append({"conversation": key, "detail": detail, **data})
                    else:
                        stale.append(Violation("stale_mutations", key, detail, data))
                turn_mutations.append(item)
    return stale, raced


def check_late_mutations(ev: Evidence, calls: dict[str, list[dict[str, Any]]]) -> list[Violation]:
    """Router mutations that took effect after a person's takeover or edit of the conversation although the
    router's last fresh read (`get_conversation`) came before that action, whatever they changed (issue 22: the
    router acted on a conversation that was no longer its own). A customer message that gives the conversation
    back to the bot starts a new turn: what people did before it no longer counts."""
    late: list[Violation] = []
    for key, timeline in _timelines(ev, calls, BOT_OPS):
        last_read: dict[str, Any] | None = None
        person: dict[str, Any] | None = None
        for _seq, kind, item in timeline:
            if kind == "read":
                last_read = item
            elif kind == "person":
                if item["action"] == "customer_message":
                    if item["after"]["status"] == "pending" and item["before"]["status"] != "pending":
                        person = None  # Chatwoot gave the conversation back to the bot
                elif item["action"] in PERSON_ACTIONS:
                    person = item
            elif person is not None and (last_read is None or last_read["applied_seq"] < person["seq"]):
                detail = (
                    f"{_call_text(item)} at +{item['applied_at'] - person['at']:.2f}s after the person's "
                    f"{person['action']} {json.dumps(person['args'], separators=(',', ':'))} (seq={person['seq']}); "
                    + (
                        f"last fresh read seq={last_read['applied_seq']}, before the person's action"
                        if last_read is not None
                        else "no fresh read before it"
                    )
                )
                data = {"call": item, "person_action": person, "last_read": last_read}
                late.append(Violation("late_mutations", key, detail, data))
    return late


def read_to_mutation_ms(ev: Evidence) -> dict[str, float]:
    """How long after its fresh read (the command's issue time, as the log has it) each router mutation reached
    Chatwoot: what ROUTER_FRESH_READ_MS must allow with headroom (p50, p99, max, in milliseconds)."""
    issued: dict[tuple[str, str], list[int]] = defaultdict(list)
    for record in ev.effects:
        value = record.value if isinstance(record.value, dict) else {}
        op = (value.get("params") or {}).get("op")
        if op in BOT_OPS or op == "unassign":
            issued[(str(value.get("key")), "assign" if op == "unassign" else str(op))].append(int(value["at_ms"]))
    gaps: list[float] = []
    for call in ev.api_calls:
        key = key_of_path(call.get("path", ""))
        if call.get("token") != "bot" or not call.get("applied") or key is None:
            continue
        before = [at for at in issued.get((key, call["op"]), []) if at <= call["at"] * 1000 + 5]
        if before:
            gaps.append(call["at"] * 1000 - max(before))
    gaps.sort()
    if not gaps:
        return {}
    return {"p50": gaps[len(gaps) // 2], "p99": gaps[min(len(gaps) - 1, len(gaps) * 99 // 100)], "max": gaps[-1]}


def stale_reads(ev: Evidence) -> int:
    """How often a worker did not make a mutation because its read was not fresh (`stale_read` outcomes)."""
    count = 0
    for record in ev.events:
        value = record.value if isinstance(record.value, dict) else {}
        parts = value.get("outcomes") if value.get("type") == "chained_outcomes" else [value]
        for part in parts or []:
            error = part.get("error") if isinstance(part, dict) else None
            if isinstance(error, dict) and error.get("kind") == "stale_read":
                count += 1
    return count


def _folded_offsets(ev: Evidence) -> tuple[dict[str, set[int]], dict[str, int]]:
    """Per key: every event offset some written state carries, and the offset of the key's last state."""
    folded: dict[str, set[int]] = defaultdict(set)
    last: dict[str, int] = {}
    for record in sorted(ev.changelog, key=lambda r: (r.partition, r.offset)):
        if isinstance(record.value, dict) and isinstance(record.value.get("offset"), int):
            folded[record.key].add(record.value["offset"])
            last[record.key] = record.value["offset"]
        elif record.value is None:
            last.pop(record.key, None)
    return folded, last


def check_folded(ev: Evidence) -> tuple[list[Violation], list[Violation]]:
    """Acknowledged webhooks missing from the log or never applied; any record of the log never applied."""
    folded, last = _folded_offsets(ev)
    by_delivery: dict[str, list[Record]] = defaultdict(list)
    by_key: dict[str, list[Record]] = defaultdict(list)
    for record in ev.events:
        if isinstance(record.value, dict):
            by_key[record.key].append(record)
            if record.value.get("type") == "webhook_received" and record.value.get("delivery_id"):
                by_delivery[record.value["delivery_id"]].append(record)
    scope = set(ev.scope)
    unfolded: list[Violation] = []
    for delivery in ev.webhooks:
        key = f"{delivery['account_id']}:{delivery['conversation_id']}"
        acked = [
            a
            for a in delivery["attempts"]
            if a.get("status") is not None
            and 200 <= a["status"] < 300
            and '"ignored":true' not in a.get("response", "")
        ]
        if key not in scope or not acked:
            continue
        records = by_delivery.get(delivery["delivery_id"], [])
        what = f"{delivery['event']} delivery {delivery['delivery_id']} (acknowledged at {acked[0]['at']:.3f})"
        if not records:
            unfolded.append(
                Violation("unfolded", key, f"{what} is not on the conversations topic", {"delivery": delivery})
            )
            continue
        state_offset = last.get(key, -1)
        for record in records:
            if record.offset in folded.get(key, set()):
                continue
            if state_offset < record.offset:
                why = f"the key's last state is at offset {state_offset}"
            else:
                why = f"no state carries it, the key's last state is at offset {state_offset} (skipped)"
            unfolded.append(
                Violation(
                    "unfolded",
                    key,
                    f"{what} at partition {record.partition} offset {record.offset} was never applied: {why}",
                    {"delivery": delivery, "partition": record.partition, "offset": record.offset},
                )
            )
    skipped: list[Violation] = []
    for key, records in by_key.items():
        if not CONVERSATION_KEY.match(key):
            continue  # e.g. the per-partition configuration markers, which have no conversation state
        applied, state_offset = folded.get(key, set()), last.get(key, -1)
        missing = [r for r in records if r.offset not in applied]
        if missing:
            types = Counter(str(r.value.get("type")) for r in missing)
            skipped.append(
                Violation(
                    "skipped_records",
                    key,
                    f"{len(missing)} of {len(records)} records never applied (partition {missing[0].partition}, "
                    f"offsets {[r.offset for r in missing][:12]}, types {dict(types)}); last state at offset "
                    f"{state_offset}",
                    {"offsets": [r.offset for r in missing], "partition": missing[0].partition},
                )
            )
    return unfolded, skipped


def check_ended(ev: Evidence, calls: dict[str, list[dict[str, Any]]]) -> list[Violation]:
    found = []
    forgotten = set(ev.forgets) | set(forgotten_records(ev))
    for key in ev.scope:
        state = ev.conversations.get(key)
        if state is None:
            continue  # deleted: nothing to end
        if key in forgotten:
            continue  # never routed again by design (issue 32): check_forgets judges its erasure
        if state["status"] == "pending" or state.get("bot_assignee_id") is not None:
            recent = "; ".join(_call_text(c) for c in calls.get(key, [])[-4:]) or "no API calls"
            found.append(
                Violation(
                    "unended",
                    key,
                    f"status={state['status']} bot_assignee_id={state.get('bot_assignee_id')} "
                    f"assignee_id={state.get('assignee_id')}; last calls: {recent}",
                    {"state": {k: v for k, v in state.items() if k != "messages"}},
                )
            )
    return found


def check_tokens(ev: Evidence) -> list[Violation]:
    found = []
    for call in ev.api_calls:
        wanted = "bot" if call["op"] in BOT_OPS else "user" if call["op"] in USER_OPS else None
        if wanted is not None and call.get("token") != wanted:
            found.append(
                Violation(
                    "wrong_tokens",
                    key_of_path(call.get("path", "")),
                    f"{_call_text(call)} used token {call.get('token')!r}, expected {wanted!r}",
                    {"call": call},
                )
            )
    return found


def jev_repeats(ev: Evidence) -> dict[str, int]:
    """Conversation (by its tag, else the text) -> how many 2xx answers its most-asked input got, when > 1."""
    answered: Counter[str] = Counter()
    for call in ev.systemone_calls:
        body = call.get("body")
        if isinstance(body, dict) and 200 <= (call.get("status") or 0) < 300:
            answered[str((body.get("state") or {}).get("ticket"))] += 1
    repeats: dict[str, int] = {}
    for ticket, count in answered.items():
        if count > 1:
            owner = next((key for tag, key in ev.tags.items() if tag in ticket), ticket[:60])
            repeats[owner] = max(repeats.get(owner, 0), count)
    return repeats


def endings(ev: Evidence) -> dict[str, dict[str, int]]:
    """Scenario kind -> final ending -> count (status, and whether a person or the bot is assigned)."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for key in ev.scope:
        state = ev.conversations.get(key)
        ending = (
            "deleted"
            if state is None
            else state["status"] + (f"/assignee={state['assignee_id']}" if state.get("assignee_id") is not None else "")
        )
        table[ev.plans.get(key, "?")][ending] += 1
    return {kind: dict(counter) for kind, counter in sorted(table.items())}


def fold_lags(ev: Evidence) -> list[dict[str, Any]]:
    """Per acknowledged webhook record: seconds from its write to the first state that applied it (record
    timestamps, one machine's clock), slowest first."""
    first_applied: dict[tuple[str, int], int] = {}
    for record in ev.changelog:
        if isinstance(record.value, dict) and isinstance(record.value.get("offset"), int):
            slot = (record.key, record.value["offset"])
            first_applied[slot] = min(first_applied.get(slot, record.timestamp_ms), record.timestamp_ms)
    lags = []
    for record in ev.events:
        if isinstance(record.value, dict) and record.value.get("type") == "webhook_received":
            applied = first_applied.get((record.key, record.offset))
            if applied is not None:
                lags.append(
                    {
                        "conversation": record.key,
                        "partition": record.partition,
                        "offset": record.offset,
                        "event": record.value.get("event"),
                        "lag_s": round((applied - record.timestamp_ms) / 1000, 3),
                    }
                )
    return sorted(lags, key=lambda lag: -lag["lag_s"])


def repeated_mutations(ev: Evidence, calls: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Router mutations applied again, identically, within one turn (no customer message gave the conversation
    back to the bot in between): a command executed more than once, whether or not a person noticed."""
    pending_at: dict[str, list[int]] = defaultdict(list)
    for action in ev.person_actions:
        before, after = action["before"]["status"], action["after"]["status"]
        if action["action"] == "customer_message" and after == "pending" and before != "pending":
            pending_at[f"{action['account_id']}:{action['conversation_id']}"].append(action["seq"])
    found = []
    for key in ev.scope:
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for call in sorted(
            (c for c in calls.get(key, []) if c["op"] in MUTATIONS and c.get("applied")), key=lambda c: c["applied_seq"]
        ):
            slot = (call["op"], json.dumps(call.get("body"), sort_keys=True))
            earlier = seen.get(slot)
            if earlier is not None and not any(
                earlier["applied_seq"] < seq < call["applied_seq"] for seq in pending_at.get(key, [])
            ):
                found.append(
                    {
                        "conversation": key,
                        "call": _call_text(call),
                        "after_s": round(call["applied_at"] - earlier["applied_at"], 2),
                        "first_seq": earlier["applied_seq"],
                    }
                )
            seen[slot] = call
    return found


def _whole(value: dict[str, Any]) -> bool:
    """An erasure of the whole conversation (not only the text sealed so far: scope `text`, issue 32)."""
    return value.get("scope", "conversation") == "conversation"


def forgotten_records(ev: Evidence) -> dict[str, Record]:
    """Per conversation in scope: its first `Forgotten` record (of the whole conversation) on the conversations
    topic, the one the fold keeps."""
    scope = set(ev.scope)
    first: dict[str, Record] = {}
    for record in sorted(ev.events, key=lambda r: (r.partition, r.offset)):
        value = record.value
        if (
            record.key in scope
            and record.key not in first
            and isinstance(value, dict)
            and value.get("type") == "forgotten"
            and _whole(value)
        ):
            first[record.key] = record
    return first


def check_forgets(ev: Evidence, calls: dict[str, list[dict[str, Any]]]) -> tuple[list[Violation], dict[str, Any]]:
    """Issue 32 under kills: every conversation the run forgot has its proof on the log (and `forget` said so),
    no router mutation or reply reached Chatwoot after it, and its latest record on `<app>.keys` is the fence."""
    violations: list[Violation] = []
    proofs = forgotten_records(ev)
    for key, asked in sorted(ev.forgets.items()):
        attempts = asked.get("attempts", [])
        codes = [a.get("code") for a in attempts]
        if key not in proofs:
            violations.append(
                Violation(
                    "forget_incomplete",
                    key,
                    f"forgotten ({asked.get('when')}, asked at {asked.get('asked_at_s')}s) but no `Forgotten` record "
                    f"on the conversations topic; `forget` exit codes {codes}",
                    {"forget": asked},
                )
            )
        elif 0 not in codes:
            violations.append(
                Violation(
                    "forget_incomplete",
                    key,
                    f"its `Forgotten` record is on the log (offset {proofs[key].offset}) but `forget` never confirmed "
                    f"it: exit codes {codes}",
                    {"forget": asked},
                )
            )
    in_flight: list[str] = []
    reads_after: list[str] = []
    for key, proof in sorted(proofs.items()):
        at_s = int(proof.value["at_ms"]) / 1000
        for call in calls.get(key, []):
            arrived = float(call.get("at", 0.0))
            if call.get("token") == "bot" and call["op"] in BOT_OPS and call.get("applied"):
                if arrived > at_s:
                    violations.append(
                        Violation(
                            "mutated_after_forgotten",
                            key,
                            f"{_call_text(call)} arrived {arrived - at_s:+.3f}s after the `Forgotten` record "
                            f"(partition {proof.partition} offset {proof.offset}, at_ms {proof.value['at_ms']})",
                            {"call": call, "forgotten_offset": proof.offset, "forgotten_at_ms": proof.value["at_ms"]},
                        )
                    )
                elif float(call.get("applied_at", arrived)) > at_s:
                    in_flight.append(f"{key}: {_call_text(call)} arrived {arrived - at_s:+.3f}s, applied after")
            elif arrived > at_s and call.get("token") == "user":
                reads_after.append(f"{key}: {call['op']} {arrived - at_s:+.3f}s")
    tag_of = {key: tag for tag, key in ev.tags.items()}
    systemone_after = []
    for call in ev.systemone_calls:
        text = json.dumps(call.get("body"))
        for key, proof in proofs.items():
            tag = tag_of.get(key)
            if tag and tag in text and float(call.get("at", 0.0)) > int(proof.value["at_ms"]) / 1000:
                systemone_after.append(key)
    moments = Counter(forget_moment(ev, key, int(proof.value["at_ms"]) / 1000, calls) for key, proof in proofs.items())
    keys: dict[str, list[Record]] = defaultdict(list)
    for record in ev.keys:
        keys[record.key].append(record)
    for key in sorted(set(proofs) | set(ev.forgets)):
        history = sorted(keys.get(key, []), key=lambda r: r.offset)
        fences = [
            r for r in history if isinstance(r.value, dict) and r.value.get("type") == "erased" and _whole(r.value)
        ]
        latest = history[-1].value if history else None
        if not fences:
            violations.append(
                Violation(
                    "keys_not_fenced",
                    key,
                    f"no erasure fence on the keys topic ({len(history)} records of it, latest {_key_text(latest)})",
                    {"records": [asdict(r) for r in history]},
                )
            )
            continue
        after = [
            r
            for r in history
            if r.offset > fences[0].offset and not (isinstance(r.value, dict) and r.value.get("type") == "erased")
        ]
        if after or not (isinstance(latest, dict) and latest.get("type") == "erased" and _whole(latest)):
            violations.append(
                Violation(
                    "keys_not_fenced",
                    key,
                    f"fenced at offset {fences[0].offset}, but then "
                    + ", ".join(f"{_key_text(r.value)} at offset {r.offset}" for r in after)
                    + f"; latest {_key_text(latest)}",
                    {"records": [asdict(r) for r in history]},
                )
            )
    info = {
        "forgets": len(ev.forgets),
        "forgotten_records": len(proofs),
        "moments": dict(moments),
        "forget_attempts_failed": sum(1 for f in ev.forgets.values() for a in f.get("attempts", []) if a.get("code")),
        "in_flight_at_forget": in_flight,
        "reads_after_forgotten": reads_after,
        "systemone_after_forgotten": sorted(set(systemone_after)),
    }
    return violations, info


def forget_moment(ev: Evidence, key: str, at_s: float, calls: dict[str, list[dict[str, Any]]]) -> str:
    """Where the conversation was when it was forgotten, as Chatwoot saw it: `before_routing` (no router call for
    it yet), `mid_route` (pending or still the bot's, the router at work), `after_end` (the router had ended it)."""
    seen: list[tuple[float, dict[str, Any]]] = []
    router_calls = 0
    for call in calls.get(key, []):
        if call.get("applied") and float(call.get("applied_at", call["at"])) <= at_s:
            router_calls += 1
            if call.get("after"):
                seen.append((float(call["applied_at"]), call["after"]))
    for action in ev.person_actions:
        if f"{action['account_id']}:{action['conversation_id']}" == key and float(action["at"]) <= at_s:
            seen.append((float(action["at"]), action["after"]))
    if not router_calls:
        return "before_routing"
    last = max(seen, key=lambda item: item[0])[1] if seen else {}
    return "mid_route" if last.get("status") == "pending" or last.get("bot_assignee_id") is not None else "after_end"


def _key_text(value: Any) -> str:
    if value is None:
        return "none (a tombstone, or no record)"
    if not isinstance(value, dict):
        return repr(value)[:60]
    return f"{value.get('type')}" + (f" ({value.get('scope')})" if value.get("scope") else "")


def check_generations(ev: Evidence) -> list[Violation]:
    """No changelog write of an older group generation lands after one of a newer generation in the same partition
    (issue 34): a worker that lost its partitions (paused past its session, or stuck in a revoke) must not write
    its old states over the new owner's. Records without the stamp (written before it existed) are skipped."""
    violations = []
    newest: dict[int, tuple[int, int]] = {}  # partition -> (generation, offset of its first write)
    for record in sorted(ev.changelog, key=lambda r: (r.partition, r.offset)):
        if record.generation is None:
            continue
        seen = newest.get(record.partition)
        if seen is not None and record.generation < seen[0]:
            violations.append(
                Violation(
                    "stale_writes",
                    record.key,
                    f"changelog partition {record.partition} offset {record.offset}: a write of generation "
                    f"{record.generation} after generation {seen[0]}'s (from offset {seen[1]})",
                    {"partition": record.partition, "offset": record.offset, "generation": record.generation},
                )
            )
        elif seen is None or record.generation > seen[0]:
            newest[record.partition] = (record.generation, record.offset)
    return violations


def check(ev: Evidence) -> Verdict:
    calls = _by_key(ev.api_calls)
    duplicates = check_duplicates(ev, calls)
    stale, raced = check_mutations(ev, calls)
    late = check_late_mutations(ev, calls)
    unfolded, skipped = check_folded(ev)
    unended = check_ended(ev, calls)
    tokens = check_tokens(ev)
    stale_writes = check_generations(ev)
    forget_violations, forget_info = check_forgets(ev, calls)
    violations = [
        *duplicates,
        *stale,
        *late,
        *unfolded,
        *unended,
        *skipped,
        *tokens,
        *stale_writes,
        *forget_violations,
    ]
    if ev.audit is None:
        audit_count = -1
        violations.append(Violation("audit_differences", None, "audit --verify did not run"))
    elif ev.audit.returncode not in (0, 1) or not ev.audit.summary:
        audit_count = -1
        violations.append(
            Violation(
                "audit_differences",
                None,
                f"audit --verify failed (exit {ev.audit.returncode}): {ev.audit.summary or 'no summary line'}",
            )
        )
    else:
        audit_count = len(ev.audit.differences)
        violations += [
            Violation("audit_differences", ":".join(line.split(":")[:2]), line) for line in ev.audit.differences
        ]
    # A record whose own state never reached the changelog although a later state of its key did: a worker
    # folded it, wrote the state to its local RocksDB, and was SIGKILLed before the changelog record left; the
    # same worker, restarted on the same data dir (static membership gives it its partitions back), went on
    # from that local state. Faust's at-least-once tables allow exactly this. It is explained, not a skip, when
    # `audit --verify` (a full replay, which folds every record) finds the key's live state equal to it: a real
    # skip of a webhook or an awaited outcome changes the state (job version, run step) and shows there.
    differing = {v.conversation for v in violations if v.check == "audit_differences"}
    clean = audit_count == 0
    local_only = [
        v
        for v in [*skipped, *(u for u in unfolded if "(skipped)" in u.detail)]
        if clean and v.conversation not in differing
    ]
    violations = [v for v in violations if v not in local_only]
    skipped = [v for v in skipped if v not in local_only]
    unfolded = [v for v in unfolded if v not in local_only]
    lags = fold_lags(ev)
    repeats = repeated_mutations(ev, calls)
    effect_ids = Counter(
        str(r.value.get("command_id")) for r in ev.effects if isinstance(r.value, dict) and r.value.get("command_id")
    )
    counts = {
        "duplicates": len({v.conversation for v in duplicates}),
        "stale_mutations": len(stale),
        "late_mutations": len(late),
        "unfolded": len(unfolded),
        "unended": len(unended),
        "audit_differences": audit_count,
        "skipped_records": sum(len(v.data["offsets"]) for v in skipped),
        "wrong_tokens": len(tokens),
        "stale_writes": len(stale_writes),
        "raced": len(raced),
        "jev_repeats": len(jev_repeats(ev)),
        "repeated_mutations": len(repeats),
        "late_folds": sum(1 for lag in lags if lag["lag_s"] > LATE_FOLD_S),
        "stale_reads": stale_reads(ev),
        **{name: sum(1 for v in forget_violations if v.check == name) for name in FORGET_CHECKS},
    }
    info = {
        "raced": raced,
        "repeated_mutations": repeats,
        "fold_lag_s": {
            "max": lags[0]["lag_s"] if lags else 0.0,
            "p50": lags[len(lags) // 2]["lag_s"] if lags else 0.0,
            "p99": lags[len(lags) // 100]["lag_s"] if lags else 0.0,
        },
        "late_folds": [lag for lag in lags if lag["lag_s"] > LATE_FOLD_S],
        "jev_repeats": jev_repeats(ev),
        "read_to_mutation_ms": read_to_mutation_ms(ev),
        "applied_without_own_changelog_entry": [v.line() for v in local_only],
        "effects_reissued": sum(1 for n in effect_ids.values() if n > 1),
        "effects_records": sum(effect_ids.values()),
        "event_records": len(ev.events),
        "acknowledged_webhooks": sum(
            1 for d in ev.webhooks if any(200 <= (a.get("status") or 0) < 300 for a in d["attempts"])
        ),
        "failed_webhooks": sum(1 for d in ev.webhooks if d["outcome"] == "failed"),
        "faults_fired": dict(Counter(str(c["fault"]) for c in ev.api_calls if c.get("fault"))),
        "endings": endings(ev),
        "audit_summary": ev.audit.summary if ev.audit else None,
        "forgetting": forget_info,
    }
    return Verdict(counts, violations, info)


# --- collecting the evidence -----------------------------------------------------------------------------


def _decode(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"_raw": raw[:200].decode("utf-8", "replace")}


def _generation(message: Any) -> int | None:
    for name, value in message.headers or ():
        if name == GENERATION_HEADER:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _table_key(raw: bytes | None) -> str:
    """Faust writes table keys as JSON strings; topic keys are raw "account:conversation"."""
    text = (raw or b"").decode("utf-8", "replace")
    if text.startswith('"'):
        try:
            decoded = json.loads(text)
        except ValueError:
            return text
        return decoded if isinstance(decoded, str) else text
    return text


async def read_topic(bootstrap: str, topic: str, timeout_s: float = 120) -> list[Record]:
    """Every record of `topic` from the beginning to the end offsets seen at the start (empty if missing)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000, **client_options())
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return []
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=30000, **client_options()
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Record] = []
        async with asyncio.timeout(timeout_s):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, messages in batch.items():
                    records += [
                        Record(m.partition, m.offset, _table_key(m.key), _decode(m.value), m.timestamp, _generation(m))
                        for m in messages
                        if m.offset < ends[tp]
                    ]
        return records
    finally:
        await consumer.stop()


async def collect(
    *,
    sandbox_url: str,
    bootstrap: str,
    app_id: str,
    scope: list[str],
    bot_ids: dict[int, int],
    audit: AuditResult | None,
    tags: dict[str, str] | None = None,
    plans: dict[str, str] | None = None,
    forgets: dict[str, dict[str, Any]] | None = None,
) -> Evidence:
    async with httpx.AsyncClient(timeout=60) as http:
        log = (await http.get(f"{sandbox_url}/_sandbox/log")).raise_for_status().json()
        state = (await http.get(f"{sandbox_url}/_sandbox/state")).raise_for_status().json()
    conversations = {f"{c['account_id']}:{c['id']}": c for c in state["conversations"]}
    events = await read_topic(bootstrap, f"{app_id}.conversations")
    changelog = await read_topic(bootstrap, f"{app_id}-conversation_state-changelog")
    effects = await read_topic(bootstrap, f"{app_id}.effects")
    keys = await read_topic(bootstrap, f"{app_id}.keys")
    return Evidence(
        scope=scope,
        bot_ids=bot_ids,
        api_calls=log["api_calls"],
        person_actions=log["person_actions"],
        webhooks=log["webhooks"],
        systemone_calls=log["systemone_calls"],
        conversations=conversations,
        events=events,
        changelog=changelog,
        effects=effects,
        audit=audit,
        tags=tags or {},
        plans=plans or {},
        keys=keys,
        forgets=forgets or {},
    )


def parse_audit(returncode: int, output: str) -> AuditResult:
    """`audit --verify` prints one line per difference ("key: …") and a summary line ending in "differences"."""
    lines = [line for line in output.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if line.endswith(" differences")), "")
    differences = [line for line in lines if re.match(r"^\d+:\d+: ", line)]
    return AuditResult(returncode, differences, summary)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.chaos_verify EVIDENCE.json`: check a chaos run's saved evidence again."""
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_verify", description=main.__doc__)
    parser.add_argument("evidence", type=Path, help="evidence.json from a chaos run's work directory")
    args = parser.parse_args(argv)
    verdict = check(Evidence.from_json(json.loads(args.evidence.read_text())))
    report = verdict.report()
    if report:
        print(report)
    print(" ".join(f"{name}={count}" for name, count in verdict.counts.items()), "PASS" if verdict.passed else "FAIL")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
