"""The Chatwoot and System One clients against the sandbox, over real HTTP on loopback."""

from __future__ import annotations

import copy
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from handlers.clients.chatwoot import (
    ChatwootClient,
    ChatwootError,
    ChatwootInvalidResponse,
    ChatwootNetworkError,
    ChatwootTimeout,
    ConversationMissing,
)
from handlers.clients.systemone import JevHTTPError, JevNetworkError, JevTimeout, SystemOneClient
from projections.jev import JevError, build_request
from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE
from schemas.config import RouterConfig, parse_config

USER, BOT = "user-1", "bot-5"


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE)) as running:
        yield running


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[ChatwootClient]:
    async with ChatwootClient(sandbox.url + "///", USER, {1: BOT}) as chatwoot:
        yield chatwoot


def _conversation(sandbox: Sandbox, text: str = "Hello, I was charged twice") -> int:
    conversation = sandbox.create_conversation(1, 7, contact_name="Eve Example", contact_email="eve@example.org")
    sandbox.customer_message(1, conversation.id, text)
    return conversation.id


def _last_call(sandbox: Sandbox) -> dict[str, Any]:
    return sandbox.calls[-1]


# --- reads ------------------------------------------------------------------------------------------------


async def test_get_conversation_reads_the_snapshot_fields_with_the_user_token(
    sandbox: Sandbox, client: ChatwootClient
) -> None:
    conversation_id = _conversation(sandbox)
    conversation = await client.get_conversation(1, conversation_id)
    assert (conversation.inbox_id, conversation.status, conversation.labels) == (7, "pending", [])
    assert conversation.meta.assignee is not None and conversation.meta.assignee.id == 5
    assert conversation.meta.assignee_type == "AgentBot"
    assert conversation.meta.sender is not None
    assert (conversation.meta.sender.name, conversation.meta.sender.blocked) == ("Eve Example", False)
    call = _last_call(sandbox)
    assert (call["method"], call["path"], call["token"]) == (
        "GET",
        f"/api/v1/accounts/1/conversations/{conversation_id}",
        "user",
    )


async def test_unassigned_conversation_has_no_assignee(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation = sandbox.create_conversation(1, 8)
    read = await client.get_conversation(1, conversation.id)
    assert (read.status, read.meta.assignee, read.meta.assignee_type, read.meta.has_assignee) == (
        "open",
        None,
        None,
        False,
    )


async def test_list_messages_pages_backwards_with_before(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox, "first")
    for n in range(24):
        sandbox.customer_message(1, conversation_id, f"message {n}")
    latest = await client.list_messages(1, conversation_id)
    assert len(latest.payload) == 20
    assert [m.id for m in latest.payload] == sorted(m.id for m in latest.payload)
    older = await client.list_messages(1, conversation_id, before=latest.payload[0].id)
    assert [m.content for m in older.payload][:1] == ["first"]
    assert all(m.id < latest.payload[0].id for m in older.payload)
    assert _last_call(sandbox)["query"] == {"before": str(latest.payload[0].id)}
    assert sandbox.calls[-2]["query"] == {}


async def test_list_messages_reads_email_attributes(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation = sandbox.create_conversation(1, 7)
    email = {"subject": "Invoice 42", "quoted_text": "Please help", "quoted_html": "<p>Please</p>"}
    sandbox.customer_message(1, conversation.id, "Please help\n> old", email=email)
    (message,) = (await client.list_messages(1, conversation.id)).payload
    attributes = message.content_attributes
    assert attributes is not None and attributes.email is not None
    assert attributes.email.subject == "Invoice 42"
    assert attributes.email.text_content is not None and attributes.email.text_content.quoted == "Please help"
    assert attributes.email.html_content is not None and attributes.email.html_content.quoted == "<p>Please</p>"
    assert attributes.email.auto_reply is False
    assert (message.message_type, message.sender and message.sender.type) == (0, "contact")


async def test_activity_messages_carry_their_status(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    await client.toggle_status(1, conversation_id, "resolved")
    messages = (await client.list_messages(1, conversation_id)).payload
    activity = messages[-1]
    assert activity.message_type == 2
    assert activity.content_attributes is not None and activity.content_attributes.activity is not None
    assert activity.content_attributes.activity.status == "resolved"


async def test_malformed_content_attributes_count_as_absent(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation = sandbox.create_conversation(1, 7)
    sandbox.customer_message(1, conversation.id, "x", content_attributes={"email": "not an object"})
    (message,) = (await client.list_messages(1, conversation.id)).payload
    assert message.content_attributes is None
    assert message.content == "x"


@pytest.mark.parametrize(
    "payload",
    [
        [{"message_type": 0, "content": "no id"}],
        [{"id": 1, "content": "no type"}],
        [{"id": "1", "message_type": 0}],
    ],
)
async def test_a_message_without_id_or_type_fails_the_page(
    sandbox: Sandbox, client: ChatwootClient, payload: list[dict[str, Any]]
) -> None:
    sandbox.add_fault(op="list_messages", mode="respond", body={"payload": payload})
    with pytest.raises(ChatwootInvalidResponse, match=r"^Chatwoot list messages returned an invalid response$"):
        await client.list_messages(1, 1)


async def test_inbox_bot_of_the_account(client: ChatwootClient) -> None:
    bot = await client.get_inbox_bot(1, 7)
    assert bot is not None and (bot.id, bot.account_id) == (5, 1)


async def test_inbox_without_bot_is_unlinked(client: ChatwootClient) -> None:
    assert await client.get_inbox_bot(1, 8) is None


@pytest.mark.parametrize("inbox", [9, 10])  # a system bot; another account's bot
async def test_inbox_bot_of_another_owner_is_an_error(client: ChatwootClient, inbox: int) -> None:
    with pytest.raises(ChatwootInvalidResponse, match="does not belong to the account"):
        await client.get_inbox_bot(1, inbox)


@pytest.mark.parametrize(
    ("body", "linked"),
    [
        ({}, False),
        ({"agent_bot": None}, False),
        ({"agent_bot": {}}, False),
        ({"agent_bot": {"name": "x"}}, False),
    ],
)
async def test_inbox_bot_absent_shapes_are_unlinked(
    sandbox: Sandbox, client: ChatwootClient, body: dict[str, Any], linked: bool
) -> None:
    sandbox.add_fault(op="get_inbox_bot", mode="respond", body=body)
    assert await client.get_inbox_bot(1, 7) is None


@pytest.mark.parametrize("raw", [{"id": "5", "account_id": 1}, {"id": 0, "account_id": 1}, "bot", [5]])
async def test_inbox_bot_bad_shape_is_an_error(sandbox: Sandbox, client: ChatwootClient, raw: Any) -> None:
    sandbox.add_fault(op="get_inbox_bot", mode="respond", body={"agent_bot": raw})
    with pytest.raises(ChatwootInvalidResponse):
        await client.get_inbox_bot(1, 7)


async def test_inbox_bot_json_404_is_unlinked_and_logged(
    client: ChatwootClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="handlers.clients.chatwoot"):
        assert await client.get_inbox_bot(1, 999) is None
    (record,) = [r for r in caplog.records if r.getMessage() == "Chatwoot resource deleted"]
    assert record.__dict__["operation"] == "get inbox agent bot"


async def test_list_conversations_sends_the_sweep_query(sandbox: Sandbox, client: ChatwootClient) -> None:
    ids = [_conversation(sandbox, f"ticket {n}") for n in range(27)]
    first = await client.list_conversations(1, "pending", 1)
    second = await client.list_conversations(1, "pending", 2)
    third = await client.list_conversations(1, "pending", 3)
    assert (len(first.payload), len(second.payload), third.payload) == (25, 2, [])
    assert sorted(row.id for row in first.payload + second.payload) == ids
    assert first.payload[0].meta.assignee_type == "AgentBot"
    assert _last_call(sandbox)["query"] == {"status": "pending", "assignee_type": "all", "page": "3"}


@pytest.mark.parametrize("body", [{}, {"data": {}}, {"data": {"payload": None}}])
async def test_missing_conversation_payload_is_an_empty_page(
    sandbox: Sandbox, client: ChatwootClient, body: dict[str, Any]
) -> None:
    sandbox.add_fault(op="list_conversations", mode="respond", body=body)
    assert (await client.list_conversations(1, "open", 1)).payload == []


async def test_list_conversations_json_404_is_an_ordinary_failure(sandbox: Sandbox, client: ChatwootClient) -> None:
    sandbox.add_fault(op="list_conversations", status=404)
    with pytest.raises(ChatwootError) as caught:
        await client.list_conversations(1, "open", 1)
    assert not caught.value.missing and caught.value.status == 404


async def test_canned_responses_and_agents(client: ChatwootClient) -> None:
    canned = await client.list_canned_responses(1)
    assert {(c.short_code, c.content) for c in canned} == {
        ("refund", "Refunds take five working days."),
        ("hours", "We are open 9 to 5."),
    }
    assert [agent.id for agent in await client.list_agents(1)] == [1, 2, 3]


# --- mutations --------------------------------------------------------------------------------------------


async def test_mutations_send_the_exact_bodies_with_the_bot_token(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    base = f"/api/v1/accounts/1/conversations/{conversation_id}"
    await client.set_labels(1, conversation_id, ["billing", "refund"])
    await client.assign(1, conversation_id, 2)
    await client.unassign(1, conversation_id)
    await client.toggle_status(1, conversation_id, "snoozed")
    message = await client.create_message(1, conversation_id, "Thanks, we are on it")
    calls = [(c["method"], c["path"], c["token"], c["body"]) for c in sandbox.calls]
    assert calls == [
        ("POST", base + "/labels", "bot", {"labels": ["billing", "refund"]}),
        ("POST", base + "/assignments", "bot", {"assignee_id": 2, "assignee_type": "User"}),
        ("POST", base + "/assignments", "bot", {"assignee_id": None}),
        ("POST", base + "/toggle_status", "bot", {"status": "snoozed"}),
        (
            "POST",
            base + "/messages",
            "bot",
            {"content": "Thanks, we are on it", "message_type": "outgoing", "private": False},
        ),
    ]
    assert message is not None and message.sender is not None
    assert (message.content, message.message_type, message.sender.type) == (
        "Thanks, we are on it",
        1,
        "agent_bot",
    )
    state = sandbox.conversation_state(sandbox.world.conversation(1, conversation_id))
    assert (state["labels"], state["status"], state["assignee_id"]) == (
        ["billing", "refund"],
        "snoozed",
        None,
    )


async def test_create_message_without_a_readable_receipt_returns_none(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    sandbox.add_fault(op="create_message", mode="respond", body="<html>ok</html>", content_type="text")
    assert await client.create_message(1, conversation_id, "hello") is None


async def test_mutation_on_a_deleted_conversation_is_missing(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    sandbox.delete_conversation(1, conversation_id)
    with pytest.raises(ConversationMissing) as caught:
        await client.toggle_status(1, conversation_id, "open")
    assert caught.value.missing and str(caught.value) == "Chatwoot toggle status failed with HTTP 404"


# --- failures ---------------------------------------------------------------------------------------------


async def test_json_404_on_a_read_is_missing_and_logged(
    sandbox: Sandbox, client: ChatwootClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="handlers.clients.chatwoot"):
        with pytest.raises(ConversationMissing, match=r"^Chatwoot get conversation failed with HTTP 404$"):
            await client.get_conversation(1, 4242)
        with pytest.raises(ConversationMissing):
            await client.list_messages(1, 4242)
    operations = [r.__dict__["operation"] for r in caplog.records if r.getMessage() == "Chatwoot resource deleted"]
    assert operations == ["get conversation", "list messages"]


async def test_text_404_is_an_ordinary_failure(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    sandbox.add_fault(op="get_conversation", status=404, content_type="text")
    with pytest.raises(ChatwootError) as caught:
        await client.get_conversation(1, conversation_id)
    assert (caught.value.missing, caught.value.status) == (False, 404)


async def test_bot_token_on_a_user_endpoint_is_401_and_the_error_shows_no_token(sandbox: Sandbox) -> None:
    conversation_id = _conversation(sandbox)
    async with ChatwootClient(sandbox.url, BOT, {1: BOT}) as as_bot:
        with pytest.raises(ChatwootError) as caught:
            await as_bot.list_messages(1, conversation_id)
        assert (await as_bot.get_conversation(1, conversation_id)).id == conversation_id  # bots may `show`
    assert str(caught.value) == "Chatwoot list messages failed with HTTP 401"
    assert BOT not in repr(caught.value.__dict__)


async def test_unknown_token_is_401(sandbox: Sandbox) -> None:
    async with ChatwootClient(sandbox.url, "nope", {1: "nope"}) as stranger:
        with pytest.raises(ChatwootError, match="HTTP 401"):
            await stranger.set_labels(1, 1, [])


async def test_server_error_carries_status_and_operation_only(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    sandbox.add_fault(op="toggle_status", status=503)
    with pytest.raises(ChatwootError) as caught:
        await client.toggle_status(1, conversation_id, "open")
    assert str(caught.value) == "Chatwoot toggle status failed with HTTP 503"
    assert sandbox.world.conversation(1, conversation_id).status == "pending"  # failed before applying


@pytest.mark.parametrize("status", [301, 302, 307])
async def test_redirects_are_never_followed(sandbox: Sandbox, client: ChatwootClient, status: int) -> None:
    sandbox.add_fault(op="list_agents", status=status)
    with pytest.raises(ChatwootError, match=f"^Chatwoot list agents failed with HTTP {status}$"):
        await client.list_agents(1)
    assert len(sandbox.calls) == 1


async def test_a_slow_answer_times_out(sandbox: Sandbox) -> None:
    sandbox.add_fault(op="list_agents", mode="delay", delay_ms=700)
    async with ChatwootClient(sandbox.url, USER, {}, timeout_s=0.2) as impatient:
        with pytest.raises(ChatwootTimeout, match=r"^Chatwoot list agents timed out$"):
            await impatient.list_agents(1)


async def test_a_dropped_connection_after_applying_is_a_network_error(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    sandbox.add_fault(op="set_labels", mode="apply_then_drop")
    with pytest.raises(ChatwootNetworkError) as caught:
        await client.set_labels(1, conversation_id, ["billing"])
    assert not isinstance(caught.value, ChatwootTimeout) and caught.value.status is None
    assert sandbox.world.conversation(1, conversation_id).labels == ["billing"]


async def test_connection_refused_is_a_network_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ChatwootClient(f"http://127.0.0.1:{port}", USER, {}) as nowhere:
        with pytest.raises(ChatwootNetworkError, match="network error"):
            await nowhere.list_agents(1)


async def test_every_request_is_counted(sandbox: Sandbox, client: ChatwootClient) -> None:
    conversation_id = _conversation(sandbox)
    lane = client.metered()
    await lane.get_conversation(1, conversation_id)
    sandbox.add_fault(op="list_messages", status=500)
    with pytest.raises(ChatwootError):
        await lane.list_messages(1, conversation_id)
    await client.list_agents(1)
    assert (lane.requests, client.requests) == (2, 1)


# --- System One -------------------------------------------------------------------------------------------


def _router_config(sandbox: Sandbox) -> RouterConfig:
    return parse_config(
        {
            "chatwoot": {"baseUrl": sandbox.url},
            "routing": {
                "endpoint": sandbox.systemone_url,
                "botIds": {"1": 5},
                "accounts": {
                    "1": {
                        "billing": {"assignee": 2, "covers": "Invoices, payments, charges and refunds"},
                        "sales": {"assignee": 3, "covers": "Buying plans, prices and upgrades"},
                    }
                },
                "kinds": {"1": {"refund": {"covers": "Refund requests"}}},
            },
        }
    )


@pytest.fixture
async def jev(sandbox: Sandbox) -> AsyncIterator[SystemOneClient]:
    async with SystemOneClient(sandbox.systemone_url, "jev-key") as client:
        yield client


async def test_decide_posts_the_request_and_reads_the_decision(sandbox: Sandbox, jev: SystemOneClient) -> None:
    config = _router_config(sandbox)
    body = build_request(config, 1, "I was charged twice for my invoice, please refund")
    decision = await jev.decide(body, 0.7)
    assert (decision.owner, decision.kind, decision.no_request) == ("billing", "refund", False)
    assert decision.owner_confidence >= 0.7
    assert sandbox.systemone_calls[-1]["body"] == body
    greeting = await jev.decide_ticket(config, 1, "hello, anyone there?")
    assert (greeting.owner, greeting.no_request) == (None, True)
    assert jev.requests == 2


async def test_wrong_key_is_an_http_error(sandbox: Sandbox) -> None:
    async with SystemOneClient(sandbox.systemone_url, "wrong") as jev:
        with pytest.raises(JevHTTPError, match=r"^TypeSafe Jev: HTTP 401$"):
            await jev.decide(build_request(_router_config(sandbox), 1, "hi"), 0.7)


@pytest.mark.parametrize("status", [500, 503, 302, 307])
async def test_non_2xx_is_an_http_error(sandbox: Sandbox, jev: SystemOneClient, status: int) -> None:
    sandbox.add_fault(op="systemone", status=status)
    with pytest.raises(JevHTTPError, match=rf"^TypeSafe Jev: HTTP {status}$"):
        await jev.decide(build_request(_router_config(sandbox), 1, "hi"), 0.7)
    assert len(sandbox.systemone_calls) == 1


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        ("not json", "text", "TypeSafe Jev: invalid response"),
        ({"answers": {"owner": {"choice": 1}}}, "json", "TypeSafe Jev: invalid response"),
        ({"answers": {"owner": {"choice": "marketing"}}}, "json", "TypeSafe Jev: no valid owner"),
    ],
)
async def test_bad_answers_are_errors(
    sandbox: Sandbox, jev: SystemOneClient, body: Any, content_type: str, message: str
) -> None:
    sandbox.add_fault(op="systemone", mode="respond", body=body, content_type=content_type)
    with pytest.raises(JevError, match=f"^{message}$"):
        await jev.decide(build_request(_router_config(sandbox), 1, "hi"), 0.7)


async def test_system_one_timeout_and_network_error(sandbox: Sandbox) -> None:
    sandbox.add_fault(op="systemone", mode="delay", delay_ms=700)
    body = build_request(_router_config(sandbox), 1, "hi")
    async with SystemOneClient(sandbox.systemone_url, "jev-key", timeout_s=0.2) as impatient:
        with pytest.raises(JevTimeout):
            await impatient.decide(body, 0.7)
    async with SystemOneClient("http://127.0.0.1:9/v1/systemone", "jev-key") as nowhere:
        with pytest.raises(JevNetworkError):
            await nowhere.decide(body, 0.7)
