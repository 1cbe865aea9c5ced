"""The effect executor against the sandbox over real HTTP on loopback: one command in, one outcome out."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from handlers.privacy.keyring import memory_keyring
from handlers.privacy.sealing import EMAIL_DOMAIN, message_field
from handlers.worker.effects import EffectExecutor
from handlers.worker.lanes import Lanes
from projections.turn import is_confirmed_brand_reply
from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE
from schemas.config import Secrets, Settings, parse_config
from schemas.records import (
    AgentsResult,
    Assign,
    CannedResult,
    CommandParams,
    ConversationResult,
    ConversationsPageResult,
    CreateMessage,
    CreateMessageResult,
    Decide,
    DecideResult,
    DoneResult,
    EffectCommand,
    EffectOutcome,
    GetConversation,
    GetInboxBot,
    InboxBotResult,
    ListAgents,
    ListCanned,
    ListConversations,
    MessageView,
    ReadTurn,
    ReplyHistoryResult,
    ScanReplyHistory,
    SetLabels,
    ToggleStatus,
    TurnResult,
    Unassign,
)

BOT = 5
NOW_MS = 1_700_000_000_000
NAME, EMAIL = "Evelyn Quartz", "evelyn.quartz@example.org"


def _settings(sandbox: Sandbox) -> Settings:
    config = parse_config(
        {
            "chatwoot": {"baseUrl": sandbox.url},
            "routing": {
                "endpoint": sandbox.systemone_url,
                "botIds": {"1": BOT},
                "accounts": {
                    "1": {
                        "billing": {"assignee": 2, "covers": "Invoices, payments, charges and refunds"},
                        "sales": {"assignee": 3, "covers": "Buying plans, prices and upgrades"},
                    }
                },
            },
        }
    )
    secrets = Secrets(
        chatwoot_token="user-1",
        agent_bot_tokens={1: "bot-5"},
        agent_bot_secrets={1: "secret-5"},
        typesafe_api_key="jev-key",
    )
    return Settings(config=config, secrets=secrets)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE)) as running:
        yield running


@pytest.fixture
async def executor(sandbox: Sandbox) -> AsyncIterator[EffectExecutor]:
    async with EffectExecutor(_settings(sandbox), now_ms=lambda: NOW_MS, keyring=memory_keyring()) as running:
        yield running


def opened(executor: EffectExecutor, key: str, message: MessageView) -> str | None:
    """A sealed text as the worker's own key opens it (issue 32): what the record carries is ciphertext."""
    if message.sealed_text is None:
        return message.text
    data_key = executor._keyring.known(key)
    assert data_key is not None
    return data_key.open(message.sealed_text, message_field(message.id))


def command(params: CommandParams, conversation: int | str = 1, command_id: str | None = None) -> EffectCommand:
    key = f"1:{conversation}"
    return EffectCommand(
        at_ms=NOW_MS - 5,
        key=key,
        account_id=1,
        command_id=command_id or f"{key}:1:{params.op}",
        params=params,
    )


def conversation(sandbox: Sandbox, *texts: str, inbox: int = 7) -> int:
    created = sandbox.create_conversation(1, inbox, contact_name=NAME, contact_email=EMAIL)
    for text in texts:
        sandbox.customer_message(1, created.id, text)
    return created.id


def assert_ok(outcome: EffectOutcome, requests: int) -> None:
    assert outcome.error is None, outcome.error
    assert outcome.requests == requests
    assert outcome.at_ms == NOW_MS


# --- reads ------------------------------------------------------------------------------------------------


async def test_get_conversation_reports_the_snapshot_and_only_the_email_domain(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "hello")
    outcome = await executor.execute(command(GetConversation(), conv))
    assert_ok(outcome, 1)
    assert (outcome.key, outcome.command_id, outcome.op) == (
        f"1:{conv}",
        f"1:{conv}:1:get_conversation",
        "get_conversation",
    )
    assert isinstance(outcome.result, ConversationResult)
    view = outcome.result.conversation
    assert (view.inbox_id, view.status, view.assignee_type, view.assignee_id, view.has_assignee) == (
        7,
        "pending",
        "AgentBot",
        BOT,
        True,
    )
    assert (view.blocked, view.email_domain) == (False, None)  # sealed (issue 32): never plaintext on the record
    data_key = executor._keyring.known(f"1:{conv}")
    assert data_key is not None and view.sealed_email_domain is not None
    assert data_key.open(view.sealed_email_domain, EMAIL_DOMAIN) == "example.org"
    text = outcome.model_dump_json()
    assert "Evelyn" not in text and "Quartz" not in text and EMAIL not in text


async def test_a_deleted_conversation_is_missing(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.delete_conversation(1, conv)
    for params in (GetConversation(), ReadTurn(), SetLabels(labels=("billing",)), ToggleStatus(status="open")):
        outcome = await executor.execute(command(params, conv))
        assert outcome.result is None
        assert outcome.error is not None and (outcome.error.kind, outcome.error.status) == ("missing", 404)
        assert outcome.requests == 1


@pytest.mark.parametrize(("inbox", "bot_id", "bot_account"), [(7, BOT, 1), (8, None, None), (999, None, None)], ids=str)
async def test_get_inbox_bot_reads_the_linked_bot(
    executor: EffectExecutor, inbox: int, bot_id: int | None, bot_account: int | None
) -> None:
    outcome = await executor.execute(command(GetInboxBot(inbox_id=inbox)))
    assert_ok(outcome, 1)
    assert outcome.result == InboxBotResult(bot_id=bot_id, bot_account_id=bot_account)


@pytest.mark.parametrize("inbox", [9, 10], ids=["system bot", "another account's bot"])
async def test_a_foreign_inbox_bot_fails_with_a_clear_reason(executor: EffectExecutor, inbox: int) -> None:
    outcome = await executor.execute(command(GetInboxBot(inbox_id=inbox)))
    assert outcome.result is None and outcome.error is not None
    assert outcome.error.kind == "failed"
    assert outcome.error.reason is not None and "does not belong to the account" in outcome.error.reason
    assert outcome.error.code == "foreign_bot"  # named, so the stuck conversation can be listed (Decisions 9)


async def test_a_three_page_turn_read_costs_four_requests_and_redacts_the_contact(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    raw = f"This is {NAME}, write to {EMAIL} about invoice 17"
    texts = [raw, *(f"note {n}" for n in range(44))]  # 45 messages: pages of 20, 20 and 5
    conv = conversation(sandbox, *texts)
    calls_before = len(sandbox.calls)
    outcome = await executor.execute(command(ReadTurn(), conv))
    assert_ok(outcome, 4)
    assert [call["op"] for call in sandbox.calls[calls_before:]] == ["get_conversation"] + ["list_messages"] * 3
    assert isinstance(outcome.result, TurnResult)
    turn = outcome.result
    assert (turn.complete, turn.deleted, turn.boundary) == (True, False, None)
    incoming = [m for m in turn.messages if m.message_type == 0]
    assert len(incoming) == 45
    assert [m.id for m in turn.messages] == sorted(m.id for m in turn.messages)
    key = f"1:{conv}"
    assert opened(executor, key, incoming[0]) == "This is [REDACTED], write to [REDACTED] about invoice 17"
    assert opened(executor, key, incoming[1]) == "note 0"
    assert all(m.text is None and m.sealed_text is not None and m.usable for m in incoming)
    text = outcome.model_dump_json()
    for secret in ("Evelyn", "Quartz", EMAIL, raw, "invoice 17", "note 0"):
        assert secret not in text


async def test_the_longest_turn_read_makes_exactly_the_requests_its_command_declares(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    """The fold budgets and times a turn read by `ReadTurn.max_requests`: a conversation read and 5 pages."""
    conv = conversation(sandbox, *(f"note {n}" for n in range(130)))  # more than 5 pages of 20
    outcome = await executor.execute(command(ReadTurn(), conv))
    assert outcome.error is None and outcome.requests == ReadTurn.max_requests == 6
    assert isinstance(outcome.result, TurnResult) and not outcome.result.complete


async def test_the_turn_read_stops_at_the_status_boundary(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "old question")
    sandbox.human_status(1, conv, 1, "resolved")
    sandbox.customer_message(1, conv, "new question")
    outcome = await executor.execute(command(ReadTurn(), conv))
    assert_ok(outcome, 2)
    assert isinstance(outcome.result, TurnResult)
    assert outcome.result.boundary is not None and outcome.result.boundary.activity_status == "resolved"
    incoming = [m for m in outcome.result.messages if m.message_type == 0]
    assert [opened(executor, f"1:{conv}", m) for m in incoming] == ["new question"]


async def test_a_malformed_message_page_fails_the_turn_read(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="list_messages", mode="respond", body={"payload": [{"id": "seven", "message_type": 0}]})
    outcome = await executor.execute(command(ReadTurn(), conv))
    assert outcome.result is None and outcome.error is not None
    assert (outcome.error.kind, outcome.error.status, outcome.requests) == ("failed", 200, 2)
    assert outcome.error.code == "malformed_page"


async def test_reply_history_finds_our_reply_or_reports_none(sandbox: Sandbox, executor: EffectExecutor) -> None:
    quiet = conversation(sandbox, "hello")
    outcome = await executor.execute(command(ScanReplyHistory(bot_id=BOT), quiet))
    assert_ok(outcome, 1)
    assert outcome.result == ReplyHistoryResult(found="complete_none")

    answered = conversation(sandbox, "hello")
    await executor.execute(command(CreateMessage(content="We are on it."), answered))
    for n in range(25):  # push our reply onto the second page
        sandbox.customer_message(1, answered, f"more {n}")
    outcome = await executor.execute(command(ScanReplyHistory(bot_id=BOT), answered))
    assert_ok(outcome, 2)
    assert outcome.result == ReplyHistoryResult(found="found")


async def test_list_canned_returns_the_exact_short_code_only(executor: EffectExecutor) -> None:
    found = await executor.execute(command(ListCanned(short_code="refund")))
    assert_ok(found, 1)
    assert found.result == CannedResult(content="Refunds take five working days.")
    near = await executor.execute(command(ListCanned(short_code="refun")))
    assert_ok(near, 1)
    assert near.result == CannedResult(content=None)


async def test_list_agents(executor: EffectExecutor) -> None:
    outcome = await executor.execute(command(ListAgents()))
    assert_ok(outcome, 1)
    assert isinstance(outcome.result, AgentsResult)
    assert sorted(outcome.result.agent_ids) == [1, 2, 3]


async def test_list_conversations_reports_rows_with_their_assignee(sandbox: Sandbox, executor: EffectExecutor) -> None:
    ours = conversation(sandbox, "hello")
    theirs = conversation(sandbox, "hi")
    sandbox.human_assign(1, theirs, 1, 2)  # a person taking it also opens it
    rows = {}
    for page, status in enumerate(("pending", "open"), start=1):
        sweep = EffectCommand(
            at_ms=NOW_MS,
            key=f"1:{status}",
            account_id=1,
            command_id=f"1:{status}:3:{page}",
            params=ListConversations(status=status, page=1),
        )
        outcome = await executor.execute(sweep)
        assert_ok(outcome, 1)
        assert isinstance(outcome.result, ConversationsPageResult)
        assert sandbox.calls[-1]["query"] == {"status": status, "assignee_type": "all", "page": "1"}
        rows[status] = {row.id: (row.assignee_type, row.assignee_id) for row in outcome.result.rows}
    assert rows["pending"] == {ours: ("AgentBot", BOT)}
    assert rows["open"] == {theirs: ("User", 2)}


# --- System One -------------------------------------------------------------------------------------------


async def test_decide_asks_system_one_once_per_command_id(sandbox: Sandbox, executor: EffectExecutor) -> None:
    ask = command(Decide(input_key="k1", text="I was charged twice for my invoice, please refund"), 3)
    first = await executor.execute(ask)
    assert_ok(first, 1)
    assert isinstance(first.result, DecideResult) and first.result.decision.owner == "billing"
    again = await executor.execute(ask)
    assert again == first
    assert len(sandbox.systemone_calls) == 1
    other = await executor.execute(command(Decide(input_key="k1", text="hello"), 3, "1:3:2:decide"))
    assert_ok(other, 1)
    assert len(sandbox.systemone_calls) == 2


async def test_system_one_errors_are_classified(sandbox: Sandbox) -> None:
    sandbox.add_fault(op="systemone", status=503)
    sandbox.add_fault(op="systemone", mode="delay", delay_ms=700)
    async with EffectExecutor(
        _settings(sandbox), now_ms=lambda: NOW_MS, timeout_s=0.2, keyring=memory_keyring()
    ) as impatient:
        failed = await impatient.execute(command(Decide(input_key="k", text="refund please"), 3, "a"))
        timed_out = await impatient.execute(command(Decide(input_key="k", text="refund please"), 3, "b"))
    assert failed.error is not None and (failed.error.kind, failed.error.status) == ("failed", 503)
    assert failed.error.reason == "TypeSafe Jev: HTTP 503" and failed.requests == 1
    assert timed_out.error is not None and (timed_out.error.kind, timed_out.requests) == ("timeout", 1)


# --- mutations --------------------------------------------------------------------------------------------


async def test_mutations_change_the_conversation_with_the_bot_token(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    steps: list[tuple[CommandParams, str]] = [
        (SetLabels(labels=("billing", "vip")), "set_labels"),
        (Assign(assignee_id=2), "assign"),
        (Unassign(), "unassign"),
        (ToggleStatus(status="resolved"), "toggle_status"),
    ]
    for params, op in steps:
        outcome = await executor.execute(command(params, conv))
        assert_ok(outcome, 1)
        assert isinstance(outcome.result, DoneResult) and outcome.result.op == op
        assert sandbox.calls[-1]["token"] == "bot"
        if op == "set_labels":
            assert sandbox.world.conversation(1, conv).labels == ["billing", "vip"]
        if op == "assign":
            assert sandbox.world.conversation(1, conv).assignee_id == 2
        if op == "unassign":
            assert sandbox.world.conversation(1, conv).assignee_id is None
    assert sandbox.world.conversation(1, conv).status == "resolved"


async def test_a_server_error_fails_with_its_status(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="set_labels", status=503)
    sandbox.add_fault(op="get_conversation", status=404, content_type="text")
    labels = await executor.execute(command(SetLabels(labels=("billing",)), conv))
    assert labels.error is not None and (labels.error.kind, labels.error.status) == ("failed", 503)
    assert labels.error.reason == "Chatwoot set labels failed with HTTP 503"
    assert sandbox.world.conversation(1, conv).labels == []
    proxy = await executor.execute(command(GetConversation(), conv))
    assert proxy.error is not None and (proxy.error.kind, proxy.error.status) == ("failed", 404)


async def test_a_slow_chatwoot_answer_times_out(sandbox: Sandbox) -> None:
    sandbox.add_fault(op="list_agents", mode="delay", delay_ms=700)
    async with EffectExecutor(
        _settings(sandbox), now_ms=lambda: NOW_MS, timeout_s=0.2, keyring=memory_keyring()
    ) as impatient:
        outcome = await impatient.execute(command(ListAgents()))
    assert outcome.result is None and outcome.error is not None
    assert (outcome.error.kind, outcome.error.status, outcome.requests) == ("timeout", None, 1)


async def test_create_message_returns_a_confirmed_receipt(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    outcome = await executor.execute(command(CreateMessage(content="Refunds take five working days."), conv))
    assert_ok(outcome, 1)
    assert isinstance(outcome.result, CreateMessageResult)
    receipt = outcome.result.message
    assert is_confirmed_brand_reply(receipt, BOT)
    assert receipt is not None and receipt.conversation_id == conv and receipt.text is None
    sent = sandbox.world.sorted_messages(sandbox.world.conversation(1, conv))[-1]
    assert (sent.id, sent.content) == (receipt.id, "Refunds take five working days.")


@pytest.mark.parametrize(
    ("fault", "status"),
    [({"mode": "apply_then_drop"}, None), ({"mode": "apply_then_fail", "status": 502}, 502), ({"status": 500}, 500)],
    ids=["lost response", "applied then 502", "500"],
)
async def test_create_message_failures_are_unconfirmed(
    sandbox: Sandbox,
    executor: EffectExecutor,
    caplog: pytest.LogCaptureFixture,
    fault: dict[str, object],
    status: int | None,
) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="create_message", **fault)
    content = "Refunds take five working days."
    with caplog.at_level(logging.INFO):
        outcome = await executor.execute(command(CreateMessage(content=content), conv))
    assert outcome.result is None and outcome.error is not None
    assert (outcome.error.kind, outcome.error.status, outcome.requests) == ("unconfirmed", status, 1)
    assert content not in outcome.model_dump_json()
    (warning,) = [r for r in caplog.records if r.getMessage() == "reply creation unconfirmed; handing off"]
    assert (warning.levelno, warning.__dict__["account_id"], warning.__dict__["conversation_id"]) == (
        logging.WARNING,
        1,
        conv,
    )
    assert content not in caplog.text and "bot-5" not in caplog.text


async def test_a_re_issued_decide_in_flight_waits_for_the_first_call(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    ask = command(Decide(input_key="k1", text="I was charged twice for my invoice"), 3)
    first, second = await asyncio.gather(executor.execute(ask), executor.execute(ask))
    assert first == second and first.error is None
    assert len(sandbox.systemone_calls) == 1


async def test_the_decide_memo_is_bounded(sandbox: Sandbox) -> None:
    async with EffectExecutor(
        _settings(sandbox), now_ms=lambda: NOW_MS, decide_memo_size=1, keyring=memory_keyring()
    ) as forgetful:
        for command_id in ("a", "b", "a"):
            outcome = await forgetful.execute(command(Decide(input_key="k", text="refund please"), 3, command_id))
            assert_ok(outcome, 1)
    assert len(sandbox.systemone_calls) == 3


async def test_concurrent_commands_count_only_their_own_requests(sandbox: Sandbox, executor: EffectExecutor) -> None:
    long = conversation(sandbox, *(f"note {n}" for n in range(45)))
    short = conversation(sandbox, "hello")
    long_read, short_read, agents = await asyncio.gather(
        executor.execute(command(ReadTurn(), long)),
        executor.execute(command(ReadTurn(), short)),
        executor.execute(command(ListAgents())),
    )
    assert (long_read.requests, short_read.requests, agents.requests) == (4, 2, 1)


async def test_a_slow_system_one_delays_only_its_own_lane(sandbox: Sandbox, executor: EffectExecutor) -> None:
    slow_conv, quick_conv = conversation(sandbox, "refund please"), conversation(sandbox, "hello")
    sandbox.add_fault(op="systemone", mode="delay", delay_ms=1500)
    lanes = Lanes()
    outcomes: dict[str, EffectOutcome] = {}
    quick_done = asyncio.Event()

    def run(name: str, cmd: EffectCommand) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            outcomes[name] = await executor.execute(cmd)
            if name.startswith("quick"):
                quick_done.set()

        return work

    await lanes.submit(f"1:{slow_conv}", 1, run("slow", command(Decide(input_key="k", text="refund"), slow_conv)))
    await lanes.submit(f"1:{slow_conv}", 1, run("slow next", command(GetConversation(), slow_conv)))
    await lanes.submit(f"1:{quick_conv}", 1, run("quick", command(GetConversation(), quick_conv)))
    async with asyncio.timeout(5):
        await quick_done.wait()
    assert set(outcomes) == {"quick"}  # the slow lane is still waiting for System One
    async with asyncio.timeout(10):
        await lanes.drain()
    assert list(outcomes) == ["quick", "slow", "slow next"]
    assert all(o.error is None for o in outcomes.values())


async def test_an_unreadable_receipt_is_a_result_without_a_message(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="create_message", mode="respond", body={"ok": True})
    outcome = await executor.execute(command(CreateMessage(content="Hi"), conv))
    assert_ok(outcome, 1)
    assert outcome.result == CreateMessageResult(message=None)


async def test_a_decide_for_an_unrouted_account_fails_without_a_request(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    stray = EffectCommand(
        at_ms=NOW_MS, key="2:20", account_id=2, command_id="2:20:1:decide", params=Decide(input_key="k", text="hi")
    )
    outcome = await executor.execute(stray)
    assert outcome.error is not None and (outcome.error.kind, outcome.requests) == ("failed", 0)
    assert outcome.error.reason == "account 2 is not routed"
    assert sandbox.systemone_calls == []


# --- a mutation is made only if nothing changed since its fresh read (issue 22) ---------------------------------


async def _read_updated_at(executor: EffectExecutor, conv: int) -> float:
    read = await executor.execute(command(GetConversation(), conv))
    assert isinstance(read.result, ConversationResult) and read.result.conversation.updated_at is not None
    return read.result.conversation.updated_at


async def test_a_mutation_on_an_unchanged_conversation_reads_it_once_more_and_is_made(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "I was charged twice")
    since = await _read_updated_at(executor, conv)
    outcome = await executor.execute(command(Assign(assignee_id=2), conv), unchanged_since=since)
    assert_ok(outcome, 2)  # the read right before, then the assignment
    assert sandbox.conversation_state(sandbox.world.conversation(1, conv))["assignee_id"] == 2


@pytest.mark.parametrize(
    "params",
    [Assign(assignee_id=2), SetLabels(labels=("billing",)), ToggleStatus(status="open"), CreateMessage(content="Hi")],
    ids=lambda p: p.op,
)
async def test_a_mutation_after_a_persons_change_since_its_read_is_not_made(
    sandbox: Sandbox, executor: EffectExecutor, params: CommandParams
) -> None:
    conv = conversation(sandbox, "I was charged twice")
    since = await _read_updated_at(executor, conv)
    sandbox.human_assign(1, conv, 1, 3)  # a person takes it over after the router's read
    before = sandbox.conversation_state(sandbox.world.conversation(1, conv))
    outcome = await executor.execute(command(params, conv), unchanged_since=since)
    assert outcome.error is not None and outcome.error.kind == "stale_read"  # never "unconfirmed": not sent
    assert outcome.requests == 1
    assert sandbox.conversation_state(sandbox.world.conversation(1, conv)) == before
