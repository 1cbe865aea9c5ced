"""The effect executor serves some reads again instead of asking Chatwoot (issue 40), against the sandbox over real
HTTP: a fresh read reads the conversation once, an unchanged conversation's messages are not paged again, an
inbox's bot and an account's agents are read once per ROUTER_SETTINGS_REUSE_MS, and whatever changed the
conversation (a message, a deletion, the router's own mutation) makes the turn read page again and see it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from handlers.privacy.keyring import memory_keyring
from handlers.worker.effects import EffectExecutor
from sandbox import Sandbox
from schemas.records import (
    AgentsResult,
    GetConversation,
    GetInboxBot,
    InboxBotResult,
    ListAgents,
    ReadTurn,
    SetLabels,
    TurnResult,
)
from tests.integration.test_effects import NOW_MS, _settings, command, conversation, opened
from tests.integration.test_effects import sandbox as sandbox  # the fixture


@pytest.fixture
async def executor(sandbox: Sandbox) -> AsyncIterator[EffectExecutor]:
    async with EffectExecutor(_settings(sandbox), now_ms=lambda: NOW_MS, keyring=memory_keyring()) as running:
        yield running


def calls_since(sandbox: Sandbox, before: int) -> list[str]:
    return [call["op"] for call in sandbox.calls[before:]]


async def fresh_read(executor: EffectExecutor, conv: int) -> TurnResult:
    """The conversation read and the turn read of a snapshot, as a fresh read makes them."""
    read = await executor.execute(command(GetConversation(), conv))
    assert read.error is None and read.requests == 1
    turn = await executor.execute(command(ReadTurn(), conv))
    assert turn.error is None and isinstance(turn.result, TurnResult)
    return turn.result


def texts(executor: EffectExecutor, conv: int, turn: TurnResult) -> list[str | None]:
    return [opened(executor, f"1:{conv}", m) for m in turn.messages if m.message_type == 0]


async def test_a_fresh_read_reads_the_conversation_once_and_an_unchanged_one_pages_no_more(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "I was charged twice", "invoice 17")
    before = len(sandbox.calls)
    first = await fresh_read(executor, conv)
    assert calls_since(sandbox, before) == ["get_conversation", "list_messages"]
    assert texts(executor, conv, first) == ["I was charged twice", "invoice 17"]

    before = len(sandbox.calls)
    again = await fresh_read(executor, conv)
    assert calls_since(sandbox, before) == ["get_conversation"]  # same updated_at: the same messages
    assert [m.id for m in again.messages] == [m.id for m in first.messages]
    assert texts(executor, conv, again) == texts(executor, conv, first)  # sealed again, under new nonces


async def test_a_new_message_or_a_deletion_makes_the_turn_read_page_again(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "I was charged twice")
    await fresh_read(executor, conv)
    sandbox.customer_message(1, conv, "and once more today")
    before = len(sandbox.calls)
    turn = await fresh_read(executor, conv)
    assert calls_since(sandbox, before) == ["get_conversation", "list_messages"]
    assert texts(executor, conv, turn) == ["I was charged twice", "and once more today"]

    sandbox.delete_message(1, conv, turn.messages[-1].id)
    turn = await fresh_read(executor, conv)
    assert texts(executor, conv, turn)[-1] == "This message was deleted"


async def test_after_its_own_mutation_the_turn_read_reads_the_conversation_and_pages_again(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "I was charged twice")
    await fresh_read(executor, conv)
    read = await executor.execute(command(GetConversation(), conv))
    assert read.error is None
    labels = await executor.execute(command(SetLabels(labels=("billing",)), conv))
    assert labels.error is None
    before = len(sandbox.calls)
    turn = await executor.execute(command(ReadTurn(), conv))
    # the read from before the labels is not lent; the label activity Chatwoot wrote is in the turn
    assert calls_since(sandbox, before) == ["get_conversation", "list_messages"]
    assert isinstance(turn.result, TurnResult)
    assert any(m.message_type == 2 for m in turn.result.messages)


async def test_a_forgotten_conversation_keeps_nothing_for_reuse(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "I was charged twice")
    await fresh_read(executor, conv)
    executor.forget(f"1:{conv}")
    before = len(sandbox.calls)
    await fresh_read(executor, conv)
    assert calls_since(sandbox, before) == ["get_conversation", "list_messages"]


async def test_an_inboxs_bot_and_an_accounts_agents_are_read_once_within_the_settings_bound(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    before = len(sandbox.calls)
    links = [await executor.execute(command(GetInboxBot(inbox_id=7), n)) for n in (1, 2)]
    agents = [await executor.execute(command(ListAgents(), n)) for n in (1, 2)]
    assert calls_since(sandbox, before) == ["get_inbox_bot", "list_agents"]
    assert [o.requests for o in links + agents] == [1, 0, 1, 0]
    assert links[0].result == links[1].result == InboxBotResult(bot_id=5, bot_account_id=1)
    assert isinstance(agents[1].result, AgentsResult) and sorted(agents[1].result.agent_ids) == [1, 2, 3]


async def test_settings_reuse_0_reads_the_inbox_bot_every_time(sandbox: Sandbox) -> None:
    settings = _settings(sandbox)
    keyring = memory_keyring()
    async with EffectExecutor(settings, now_ms=lambda: NOW_MS, keyring=keyring, settings_reuse_ms=0) as running:
        first = await running.execute(command(GetInboxBot(inbox_id=7)))
        sandbox.world.inboxes[7].bot_id = None  # an administrator disconnects the bot
        second = await running.execute(command(GetInboxBot(inbox_id=7)))
    assert (first.requests, second.requests) == (1, 1)
    assert first.result == InboxBotResult(bot_id=5, bot_account_id=1) and second.result == InboxBotResult()
