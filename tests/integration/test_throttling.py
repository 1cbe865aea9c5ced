"""Chatwoot's rate limit met by the effect executor over real HTTP (issue 30 "Throttling is not failure"): the
sandbox answers 429 as Rack::Attack does (plain text "Retry later", no `Retry-After`); nothing fails, nothing is
made twice, and a mutation throttled past its deadline comes back as not made (the run reads again), never as a
failure."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator

import pytest

from handlers.clients.budget import RequestBudget
from handlers.clients.chatwoot import ChatwootClient
from handlers.privacy.keyring import memory_keyring
from handlers.worker.effects import EffectExecutor
from projections.jobs import command_deadline
from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE
from schemas.records import Assign, CreateMessage, GetConversation
from tests.integration.test_effects import NOW_MS, _settings, command, conversation

THROTTLED = {"mode": "fail", "status": 429, "content_type": "text", "body": "Retry later\n"}


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE)) as running:
        yield running


@pytest.fixture
def budget() -> RequestBudget:
    return RequestBudget(first_backoff_s=0.2)  # Chatwoot's real pauses start at 5 s; the order is the same


@pytest.fixture
async def executor(sandbox: Sandbox, budget: RequestBudget) -> AsyncIterator[EffectExecutor]:
    settings = _settings(sandbox)
    secrets = settings.secrets
    client = ChatwootClient(sandbox.url, secrets.chatwoot_token, secrets.agent_bot_tokens, budget=budget)
    async with (
        client,
        EffectExecutor(settings, chatwoot=client, now_ms=lambda: NOW_MS, keyring=memory_keyring()) as running,
    ):
        yield running


def calls(sandbox: Sandbox, op: str, conv: int) -> list[dict]:
    """The sandbox's log of `op` on conversation `conv`, in order."""
    path = f"/conversations/{conv}"
    return [c for c in sandbox.calls if c["op"] == op and (c["path"].endswith(path) or f"{path}/" in c["path"])]


async def test_a_read_throttled_twice_waits_and_succeeds_and_is_charged_once(
    sandbox: Sandbox, executor: EffectExecutor, budget: RequestBudget
) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="get_conversation", times=2, **THROTTLED)
    outcome = await executor.execute(command(GetConversation(), conv))
    assert outcome.error is None and outcome.result is not None
    assert outcome.requests == 1  # the run's budget (§4.6) is charged for answers, not for refusals
    assert [c["status"] for c in calls(sandbox, "get_conversation", conv)] == [429, 429, 200]
    assert budget.stats.throttled == 2


async def test_a_throttled_assignment_is_made_once_after_the_pause_on_a_read_made_again(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "hello")
    updated_at = sandbox.world.conversation(1, conv).updated_at
    sandbox.add_fault(op="assign", times=1, **THROTTLED)
    outcome = await executor.execute(command(Assign(assignee_id=2), conv), unchanged_since=updated_at)
    assert outcome.error is None, outcome.error
    assigns = calls(sandbox, "assign", conv)
    assert [c["status"] for c in assigns] == [429, 200]
    reads = [c for c in calls(sandbox, "get_conversation", conv) if c["status"] == 200]
    assert len(reads) == 2  # the read right before the mutation, made again before the second attempt
    assert sandbox.world.conversation(1, conv).assignee_id == 2
    assert outcome.rate_wait_ms > 0  # the pause after the 429, on the conversation's record (its timeline)


async def test_a_throttled_reply_is_sent_once_and_confirmed(sandbox: Sandbox, executor: EffectExecutor) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="create_message", times=1, **THROTTLED)
    outcome = await executor.execute(command(CreateMessage(content="We are on it."), conv))
    assert outcome.error is None, outcome.error  # not "unconfirmed": a 429 is a refusal, nothing was created
    sent = [
        m for m in sandbox.world.sorted_messages(sandbox.world.conversation(1, conv)) if m.content == "We are on it."
    ]
    assert len(sent) == 1


async def test_a_mutation_throttled_until_its_deadline_is_not_made_and_is_no_failure(
    sandbox: Sandbox, executor: EffectExecutor
) -> None:
    conv = conversation(sandbox, "hello")
    sandbox.add_fault(op="assign", times=None, **THROTTLED)
    late = command(Assign(assignee_id=2), conv)
    # issued so long ago that a pause plus a request's full timeout would pass the fold's deadline for it
    at_ms = NOW_MS - (command_deadline(0, Assign.max_requests) - 30_000)
    late = late.model_copy(update={"at_ms": at_ms})
    outcome = await executor.execute(late)
    assert outcome.error is not None and outcome.error.kind == "throttled"  # the run reads again (§4.5: no failure)
    assert sandbox.world.conversation(1, conv).assignee_id != 2
