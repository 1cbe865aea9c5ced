"""The sandbox against chatwoot.md: signed webhooks and retries, Chatwoot's side effects, paging, auth,
the control API and the `chatwoot-router sandbox` command."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from handlers.clients.chatwoot import ChatwootClient
from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE, from_config
from sandbox.world import BOT_FAILURE_TEXT
from schemas.config import parse_config
from tests.support.receiver import serving
from tests.support.waiting import within

USER, BOT = "user-1", "bot-5"


@dataclass
class Receiver:
    """A router stand-in: records every webhook attempt and answers with scripted statuses (then 200)."""

    url: str = ""
    script: list[int] = field(default_factory=list)
    seen: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        status = self.script.pop(0) if self.script else 200
        self.seen.append((dict(request.headers), await request.read(), status))
        return web.Response(status=status)

    def events(self) -> list[str]:
        return [json.loads(body)["event"] for _, body, status in self.seen if status == 200]

    def payloads(self, event: str) -> list[dict[str, Any]]:
        return [
            json.loads(body) for _, body, status in self.seen if status == 200 and json.loads(body)["event"] == event
        ]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recorder = Receiver()
    async with serving(recorder.handle) as recorder.url:
        yield recorder


@pytest.fixture
async def sandbox(receiver: Receiver) -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE), webhook_url=receiver.url, retry_delay_s=0.05) as running:
        yield running


@pytest.fixture
async def api(sandbox: Sandbox) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sandbox.url) as client:
        yield client


def _path(conversation_id: int, tail: str = "") -> str:
    return f"/api/v1/accounts/1/conversations/{conversation_id}{tail}"


def _new(sandbox: Sandbox, text: str = "Hello there, my invoice is wrong") -> int:
    conversation = sandbox.create_conversation(1, 7, contact_name="Eve", contact_email="eve@example.org")
    sandbox.customer_message(1, conversation.id, text)
    return conversation.id


def _activities(sandbox: Sandbox, conversation_id: int) -> list[str]:
    messages = sandbox.world.conversation(1, conversation_id).messages
    return [m.content or "" for m in messages if m.message_type == 2]


# --- webhooks ---------------------------------------------------------------------------------------------


async def test_webhooks_are_signed_over_timestamp_and_raw_body(sandbox: Sandbox, receiver: Receiver) -> None:
    before = int(time.time())
    _new(sandbox)
    await sandbox.settle()
    after = int(time.time())
    assert receiver.seen
    for headers, body, _ in receiver.seen:
        timestamp = headers["X-Chatwoot-Timestamp"]
        expected = hmac.new(b"secret-5", timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert headers["X-Chatwoot-Signature"] == f"sha256={expected}"
        assert before <= int(timestamp) <= after  # stamped when it was sent
        assert headers["Content-Type"] == "application/json"
    assert len({headers["X-Chatwoot-Delivery"] for headers, _, _ in receiver.seen}) == len(receiver.seen)


async def test_new_message_in_a_bot_inbox_sends_message_created(sandbox: Sandbox, receiver: Receiver) -> None:
    conversation_id = _new(sandbox)
    await sandbox.settle()
    assert receiver.events() == ["conversation_updated", "message_created"]  # waiting_since, then the message
    (payload,) = receiver.payloads("message_created")
    assert (payload["message_type"], payload["content"], payload["private"]) == (
        "incoming",
        "Hello there, my invoice is wrong",
        False,
    )
    assert payload["created_at"].endswith("Z") and "type" not in payload["sender"]
    conversation = payload["conversation"]
    assert (conversation["id"], conversation["status"], conversation["inbox_id"]) == (
        conversation_id,
        "pending",
        7,
    )
    assert (
        conversation["meta"]["assignee_type"] == "AgentBot" and conversation["meta"]["assignee"]["type"] == "agent_bot"
    )
    assert conversation["messages"][0]["message_type"] == 0
    assert payload["account"] == {"id": 1, "name": "Acme"}


async def test_delivery_id_stays_the_same_across_a_500_retry(sandbox: Sandbox, receiver: Receiver) -> None:
    receiver.script = [500, 429]
    sandbox.create_conversation(1, 8)  # no bot: no events
    conversation_id = _new(sandbox)
    await sandbox.settle()
    first, second, third = receiver.seen[:3]
    assert [s for _, _, s in receiver.seen[:3]] == [500, 429, 200]
    assert first[0]["X-Chatwoot-Delivery"] == second[0]["X-Chatwoot-Delivery"] == third[0]["X-Chatwoot-Delivery"]
    assert first[1] == second[1] == third[1]
    assert sandbox.world.conversation(1, conversation_id).status == "pending"


async def test_three_500s_fail_the_delivery_and_open_the_pending_conversation(
    sandbox: Sandbox, receiver: Receiver
) -> None:
    conversation = sandbox.create_conversation(1, 7)
    receiver.script = [500, 500, 500]
    sandbox.world.conversation(1, conversation.id).waiting_since = 1.0  # only message_created goes out
    sandbox.customer_message(1, conversation.id, "hello?")
    await sandbox.settle()
    assert [s for _, _, s in receiver.seen[:3]] == [500, 500, 500]
    state = sandbox.world.conversation(1, conversation.id)
    assert (state.status, state.bot_assignee_id) == ("open", 5)  # opened, still bot-assigned
    assert _activities(sandbox, conversation.id) == [BOT_FAILURE_TEXT]
    assert receiver.events()[-3:] == [
        "conversation_opened",
        "conversation_status_changed",
        "conversation_updated",
    ]


@pytest.mark.parametrize("status", [503, 404, 401])
async def test_other_failures_are_not_retried(sandbox: Sandbox, receiver: Receiver, status: int) -> None:
    conversation = sandbox.create_conversation(1, 7)
    sandbox.world.conversation(1, conversation.id).waiting_since = 1.0
    receiver.script = [status]
    sandbox.customer_message(1, conversation.id, "hello?")
    await sandbox.settle()
    assert [s for _, _, s in receiver.seen].count(status) == 1
    assert sandbox.world.conversation(1, conversation.id).status == "open"


async def test_keep_pending_on_bot_failure_is_an_account_setting(receiver: Receiver) -> None:
    scenario = copy.deepcopy(SAMPLE)
    scenario["accounts"][0]["keep_pending_on_bot_failure"] = True
    async with run_sandbox(scenario=scenario, webhook_url=receiver.url, retry_delay_s=0.01) as sandbox:
        receiver.script = [503, 503]
        conversation_id = _new(sandbox)
        await sandbox.settle()
        assert sandbox.world.conversation(1, conversation_id).status == "pending"


async def test_no_events_for_inboxes_without_an_active_bot(sandbox: Sandbox, receiver: Receiver) -> None:
    conversation = sandbox.create_conversation(1, 8)
    sandbox.customer_message(1, conversation.id, "hi")
    sandbox.world.inboxes[7].bot_active = False
    other = sandbox.create_conversation(1, 7)
    sandbox.customer_message(1, other.id, "hi")
    await sandbox.settle()
    assert receiver.seen == []


# --- side effects -----------------------------------------------------------------------------------------


async def test_bot_opening_a_pending_conversation_hands_it_off(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    conversation_id = _new(sandbox)
    await sandbox.settle()
    receiver.seen.clear()
    response = await api.post(
        _path(conversation_id, "/toggle_status"), json={"status": "open"}, headers={"api_access_token": BOT}
    )
    assert response.json()["payload"] == {
        "success": None,
        "conversation_id": conversation_id,
        "current_status": "open",
        "snoozed_until": None,
    }
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.bot_assignee_id, state.assignee_id) == ("open", None, None)
    assert _activities(sandbox, conversation_id) == ["Conversation was reopened by Acme Router"]
    activity = state.messages[-1]
    assert activity.content_attributes == {"activity": {"type": "conversation_status_changed", "status": "open"}}
    await sandbox.settle()
    assert receiver.events() == ["conversation_opened", "conversation_status_changed", "conversation_updated"]
    status_changed = receiver.payloads("conversation_status_changed")[0]
    assert status_changed["changed_attributes"] is None
    updated = receiver.payloads("conversation_updated")[0]
    changed = {name for item in updated["changed_attributes"] for name in item}
    assert {"status", "assignee_agent_bot_id"} <= changed
    assert updated["meta"]["assignee"] is None and updated["meta"]["assignee_type"] is None


@pytest.mark.parametrize(
    ("status", "text"), [("resolved", "marked resolved"), ("snoozed", "snoozed"), ("pending", None)]
)
async def test_bot_status_changes_keep_the_bot(
    sandbox: Sandbox, api: httpx.AsyncClient, status: str, text: str | None
) -> None:
    conversation_id = _new(sandbox)
    response = await api.post(
        _path(conversation_id, "/toggle_status"), json={"status": status}, headers={"api_access_token": BOT}
    )
    assert response.status_code == 200 and response.json()["payload"]["success"] is True
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.bot_assignee_id) == (status, 5)
    activities = _activities(sandbox, conversation_id)
    if text is None:
        assert activities == []  # pending → pending changes nothing
    else:
        assert activities == [f"Conversation was {text} by Acme Router"]


async def test_incoming_message_reopens_resolved_as_pending_and_snoozed_as_open(
    sandbox: Sandbox, api: httpx.AsyncClient
) -> None:
    resolved = _new(sandbox)
    snoozed = _new(sandbox)
    for conversation_id, status in ((resolved, "resolved"), (snoozed, "snoozed")):
        await api.post(
            _path(conversation_id, "/toggle_status"),
            json={"status": status},
            headers={"api_access_token": BOT},
        )
    sandbox.customer_message(1, resolved, "back again")
    sandbox.customer_message(1, snoozed, "back again")
    assert sandbox.world.conversation(1, resolved).status == "pending"
    assert sandbox.world.conversation(1, snoozed).status == "open"
    assert len(_activities(sandbox, resolved)) == 1  # only the bot's resolve; the reopen writes none
    unbotted = sandbox.create_conversation(1, 8)
    sandbox.human_status(1, unbotted.id, 1, "resolved")
    sandbox.customer_message(1, unbotted.id, "again")
    assert sandbox.world.conversation(1, unbotted.id).status == "open"


async def test_a_person_opening_clears_the_bot_and_agents_self_assign(sandbox: Sandbox) -> None:
    conversation_id = _new(sandbox)
    sandbox.human_status(1, conversation_id, 2, "open")
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.bot_assignee_id, state.assignee_id) == ("open", None, 2)
    assert _activities(sandbox, conversation_id) == [
        "Conversation was reopened by Bob Billing",
        "Bob Billing self-assigned this conversation",
    ]
    admin_opened = _new(sandbox)
    sandbox.human_status(1, admin_opened, 1, "open")
    assert sandbox.world.conversation(1, admin_opened).assignee_id is None


async def test_assigning_a_person_opens_a_pending_bot_conversation(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    response = await api.post(
        _path(conversation_id, "/assignments"),
        json={"assignee_id": 2, "assignee_type": "User"},
        headers={"api_access_token": BOT},
    )
    assert response.json()["id"] == 2 and response.json()["role"] == "agent"
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.assignee_id, state.bot_assignee_id) == ("open", 2, None)
    assert "Assigned to Bob Billing by Acme Router" in _activities(sandbox, conversation_id)
    rest = (await api.get(_path(conversation_id), headers={"api_access_token": USER})).json()
    assert (rest["meta"]["assignee_type"], rest["meta"]["assignee"]["id"]) == ("User", 2)


async def test_unassign_clears_both_and_keeps_the_status(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    response = await api.post(
        _path(conversation_id, "/assignments"), json={"assignee_id": None}, headers={"api_access_token": BOT}
    )
    assert response.status_code == 200 and response.json() is None
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.assignee_id, state.bot_assignee_id) == ("pending", None, None)
    rest = (await api.get(_path(conversation_id), headers={"api_access_token": USER})).json()
    assert "assignee" not in rest["meta"] and "assignee_type" not in rest["meta"]


async def test_labels_replace_the_list_and_write_activities(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    headers = {"api_access_token": BOT}
    await api.post(_path(conversation_id, "/labels"), json={"labels": ["billing", "vip"]}, headers=headers)
    response = await api.post(_path(conversation_id, "/labels"), json={"labels": ["refund"]}, headers=headers)
    assert response.json() == {"payload": ["refund"]}
    assert (await api.get(_path(conversation_id, "/labels"), headers=headers)).json() == {"payload": ["refund"]}
    assert _activities(sandbox, conversation_id) == [
        "Acme Router added billing, vip",
        "Acme Router added refund",
        "Acme Router removed billing, vip",
    ]


async def test_new_conversation_status_depends_on_inbox_and_contact(sandbox: Sandbox) -> None:
    bot_inbox = sandbox.create_conversation(1, 7)
    plain = sandbox.create_conversation(1, 8)
    blocked = sandbox.create_conversation(1, 7, blocked=True)
    assert (bot_inbox.status, bot_inbox.bot_assignee_id) == ("pending", 5)
    assert (plain.status, plain.bot_assignee_id) == ("open", None)
    assert blocked.status == "resolved"
    assert [bot_inbox.id, plain.id, blocked.id] == [1, 2, 3]  # display ids count per account
    assert sandbox.create_conversation(2, 20).id == 1


# --- REST shapes, paging and auth -------------------------------------------------------------------------


async def test_message_list_pages_by_before_and_after(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation = sandbox.create_conversation(1, 8)
    ids = [sandbox.customer_message(1, conversation.id, f"m{n}").id for n in range(45)]
    headers = {"api_access_token": USER}

    async def page(**params: int) -> list[int]:
        response = await api.get(_path(conversation.id, "/messages"), params=params, headers=headers)
        return [m["id"] for m in response.json()["payload"]]

    assert await page() == ids[-20:]
    assert await page(before=ids[-20]) == ids[5:25]
    assert await page(before=ids[5]) == ids[:5]
    assert await page(after=ids[39]) == ids[40:]
    assert await page(after=ids[10], before=ids[13]) == ids[10:13]
    assert await page(before=2_147_483_648) == ids[-20:]


async def test_messages_meta_and_bot_tokens_on_user_endpoints(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    response = await api.get(_path(conversation_id, "/messages"), headers={"api_access_token": BOT})
    assert response.status_code == 401
    assert response.json() == {"error": "Access to this endpoint is not authorized for bots"}
    for path in (
        "/api/v1/accounts/1/conversations",
        "/api/v1/accounts/1/agents",
        "/api/v1/accounts/1/canned_responses",
        "/api/v1/accounts/1/inboxes/7/agent_bot",
    ):
        assert (await api.get(path, headers={"api_access_token": BOT})).status_code == 401
    assert (await api.get(_path(conversation_id), headers={"api_access_token": BOT})).status_code == 200


async def test_auth_errors_match_chatwoot(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    no_token = await api.get(_path(conversation_id))
    assert (no_token.status_code, no_token.json()) == (
        401,
        {"errors": ["You need to sign in or sign up before continuing."]},
    )
    bad = await api.get(_path(conversation_id), headers={"api_access_token": "nope"})
    assert (bad.status_code, bad.json()) == (401, {"error": "Invalid Access Token"})
    foreign = await api.get("/api/v1/accounts/2/conversations/1", headers={"api_access_token": BOT})
    assert (foreign.status_code, foreign.json()) == (
        401,
        {"error": "Bot is not authorized to access this account"},
    )
    stranger = await api.get("/api/v1/accounts/2/agents", headers={"api_access_token": "user-2"})
    assert stranger.status_code == 401
    missing = await api.get(_path(999), headers={"api_access_token": USER})
    assert (missing.status_code, missing.json()) == (404, {"error": "Resource could not be found"})
    assert missing.headers["content-type"].startswith("application/json")
    unknown_route = await api.get("/api/v1/nothing-here", headers={"api_access_token": USER})
    assert unknown_route.status_code == 404 and not unknown_route.headers["content-type"].startswith("application/json")


async def test_incoming_messages_only_in_api_inboxes(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    response = await api.post(
        _path(conversation_id, "/messages"),
        json={"content": "x", "message_type": "incoming"},
        headers={"api_access_token": BOT},
    )
    assert (response.status_code, response.json()) == (
        422,
        {"error": "Incoming messages are only allowed in Api inboxes"},
    )


async def test_conversation_list_meta_counts_and_filters(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    for _ in range(3):
        _new(sandbox)
    mine = sandbox.create_conversation(1, 8, assignee_id=1)
    sandbox.create_conversation(1, 8)
    response = await api.get(
        "/api/v1/accounts/1/conversations",
        params={"status": "all", "assignee_type": "unassigned"},
        headers={"api_access_token": USER},
    )
    data = response.json()["data"]
    assert data["meta"] == {"mine_count": 1, "assigned_count": 4, "unassigned_count": 1, "all_count": 5}
    assert len(data["payload"]) == 1
    open_only = await api.get("/api/v1/accounts/1/conversations", headers={"api_access_token": USER})
    assert {row["id"] for row in open_only.json()["data"]["payload"]} == {mine.id, mine.id + 1}


# --- faults, control API, System One, CLI -----------------------------------------------------------------


async def test_apply_then_fail_applies_the_change(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    await api.post("/_sandbox/faults", json={"op": "toggle_status", "mode": "apply_then_fail", "status": 502})
    response = await api.post(
        _path(conversation_id, "/toggle_status"),
        json={"status": "resolved"},
        headers={"api_access_token": BOT},
    )
    assert response.status_code == 502
    assert sandbox.world.conversation(1, conversation_id).status == "resolved"
    again = await api.post(
        _path(conversation_id, "/toggle_status"), json={"status": "open"}, headers={"api_access_token": BOT}
    )
    assert again.status_code == 200  # `times` defaults to once


async def test_control_api_drives_a_conversation_and_reads_it_back(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    created = (
        await api.post(
            "/_sandbox/conversations",
            json={
                "account_id": 1,
                "inbox_id": 7,
                "contact_name": "Zoe",
                "contact_email": "zoe@example.org",
                "subject": "Invoice",
            },
        )
    ).json()
    base = f"/_sandbox/conversations/1/{created['id']}"
    email = {"subject": "Invoice", "quoted_text": "Where is my invoice?", "auto_reply": False}
    await api.post(base + "/incoming", json={"content": "Where is my invoice?\n> quoted", "email": email})
    await api.post(base + "/reply", json={"user_id": 2, "content": "Looking", "private": True})
    await api.post(base + "/status", json={"user_id": 2, "status": "resolved"})
    assert (await api.post("/_sandbox/settle", json={"timeout_s": 10})).json() == {"ok": True}
    state = (await api.get("/_sandbox/state")).json()
    (conversation,) = state["conversations"]
    assert (conversation["status"], conversation["bot_assignee_id"]) == ("resolved", 5)
    kinds = [(m["message_type"], m["private"]) for m in conversation["messages"]]
    assert kinds == [(0, False), (1, True), (2, False)]
    assert conversation["messages"][0]["content_type"] == "incoming_email"
    assert conversation["messages"][0]["content_attributes"]["email"]["subject"] == "Invoice"
    assert [w["event"] for w in state["webhooks"]] == receiver.events()
    assert all(w["outcome"] == "delivered" for w in state["webhooks"])
    assert "message_created" in receiver.events()  # private notes reach bots too
    deleted = await api.delete(base)
    assert deleted.status_code == 200
    gone = await api.get(_path(created["id"]), headers={"api_access_token": USER})
    assert gone.status_code == 404
    bad = await api.post("/_sandbox/faults", json={"op": "nothing"})
    assert bad.status_code == 400


async def test_clock_moves_message_times(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation = sandbox.create_conversation(1, 8)
    before = sandbox.customer_message(1, conversation.id, "a").created_at
    await api.post("/_sandbox/clock", json={"advance_s": 1800})
    after = sandbox.customer_message(1, conversation.id, "b").created_at
    assert after - before >= 1800


async def test_system_one_stand_in_answers_the_request_shape(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    request = {
        "model": "m",
        "state": {"ticket": "Can I upgrade my plan to the team price?"},
        "questions": {
            "owner": {
                "type": "choice",
                "instructions": "i",
                "criteria": {
                    "billing": "Invoices and refunds",
                    "sales": "Plans, prices and upgrades",
                    "unclear": "u",
                },
            },
            "request": {"type": "choice", "instructions": "i", "criteria": {"request": "r", "none": "n"}},
        },
    }
    response = await api.post("/v1/systemone", json=request, headers={"authorization": "Bearer jev-key"})
    answers = response.json()["answers"]
    assert answers["owner"]["choice"] == "sales" and answers["request"]["choice"] == "request"
    assert answers["owner"]["probabilities"]["sales"] >= 0.7
    rejected = await api.post("/v1/systemone", json={"state": {}}, headers={"authorization": "Bearer jev-key"})
    assert rejected.status_code == 400


async def test_sandbox_command_serves_until_interrupted(tmp_path: Any) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(SAMPLE))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        "sandbox",
        "--port",
        "0",
        "--scenario",
        str(scenario),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode()
        assert line.startswith("ready url=http://127.0.0.1:")
        url = line.strip().removeprefix("ready url=")
        async with httpx.AsyncClient() as client:
            agents = await client.get(url + "/api/v1/accounts/1/agents", headers={"api_access_token": USER})
        assert [a["name"] for a in agents.json()] == ["Ada Admin", "Bob Billing", "Cy Sales"]
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0


async def test_scenario_from_the_router_configuration_serves_the_router(receiver: Receiver) -> None:
    config = parse_config(
        {
            "chatwoot": {"baseUrl": "http://127.0.0.1"},
            "routing": {
                "botIds": {"3": 33},
                "accounts": {"3": {"billing": {"assignee": 12, "covers": "Invoices"}}},
                "kinds": {"3": {"refund": {"covers": "Refunds", "cannedResponse": " refund "}}},
            },
        }
    )
    scenario = from_config(config, user_token="ut", bot_tokens={3: "bt"}, bot_secrets={3: "bs"})
    async with run_sandbox(scenario=scenario, webhook_url=receiver.url, retry_delay_s=0.01) as sandbox:
        async with ChatwootClient(sandbox.url, "ut", {3: "bt"}) as client:
            bot = await client.get_inbox_bot(3, 301)
            assert bot is not None and (bot.id, bot.account_id) == (33, 3)
            assert [a.id for a in await client.list_agents(3)] == [12, 1]
            assert [c.short_code for c in await client.list_canned_responses(3)] == ["refund"]
            conversation = sandbox.create_conversation(3, 301)
            sandbox.customer_message(3, conversation.id, "hello")
            await client.set_labels(3, conversation.id, ["refund"])
        await sandbox.settle()
    headers, body, _ = receiver.seen[0]
    signature = hmac.new(b"bs", headers["X-Chatwoot-Timestamp"].encode() + b"." + body, hashlib.sha256)
    assert headers["X-Chatwoot-Signature"] == "sha256=" + signature.hexdigest()


async def test_activities_can_arrive_late_like_chatwoots_background_job(
    sandbox: Sandbox, api: httpx.AsyncClient
) -> None:
    """The status changes at once and its activity message comes `activity_delay_ms` later. Told by order, not by a
    window: an activity due in an hour is not there after its change, and a later change's activity, due at
    once (10 ms), arrives before it."""
    conversation_id = _new(sandbox)
    headers = {"api_access_token": BOT}
    await api.post("/_sandbox/settings", json={"activity_delay_ms": 3_600_000})
    await api.post(_path(conversation_id, "/toggle_status"), json={"status": "resolved"}, headers=headers)
    assert sandbox.world.conversation(1, conversation_id).status == "resolved"
    assert _activities(sandbox, conversation_id) == []
    await api.post("/_sandbox/settings", json={"activity_delay_ms": 10})
    await api.post(_path(conversation_id, "/toggle_status"), json={"status": "open"}, headers=headers)
    assert sandbox.world.conversation(1, conversation_id).status == "open"
    async with within(10, "the reopening's activity message"):
        while not _activities(sandbox, conversation_id):
            await asyncio.sleep(0.01)  # polling interval, bounded by the deadline
    assert _activities(sandbox, conversation_id) == ["Conversation was reopened by Acme Router"]


async def test_snoozes_expire_when_the_clock_passes_them(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    until = int(sandbox.world.now()) + 600
    body = {"status": "snoozed", "snoozed_until": until}
    response = await api.post(_path(conversation_id, "/toggle_status"), json=body, headers={"api_access_token": BOT})
    assert response.json()["payload"]["snoozed_until"] is not None
    await api.post("/_sandbox/clock", json={"advance_s": 300})
    assert sandbox.world.conversation(1, conversation_id).status == "snoozed"
    await api.post("/_sandbox/clock", json={"advance_s": 400})
    state = sandbox.world.conversation(1, conversation_id)
    assert (state.status, state.bot_assignee_id) == ("open", 5)
    assert _activities(sandbox, conversation_id) == ["Conversation was snoozed by Acme Router"]


async def test_agents_only_see_conversations_of_their_inboxes(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    website = _new(sandbox)
    email = sandbox.create_conversation(1, 8).id
    as_cy = {"api_access_token": "user-3"}  # an agent who is a member of inbox 8 only
    denied = await api.get(_path(website), headers=as_cy)
    assert (denied.status_code, denied.json()) == (401, {"error": "You are not authorized to do this action"})
    assert (await api.get(_path(email), headers=as_cy)).status_code == 200
    listed = await api.get("/api/v1/accounts/1/conversations", params={"status": "all"}, headers=as_cy)
    assert [row["id"] for row in listed.json()["data"]["payload"]] == [email]


async def test_only_human_replies_end_the_wait(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    conversation_id = _new(sandbox)
    await api.post(
        _path(conversation_id, "/messages"), json={"content": "bot says hi"}, headers={"api_access_token": BOT}
    )
    state = sandbox.world.conversation(1, conversation_id)
    assert state.waiting_since is not None and state.first_reply_created_at is None
    sandbox.human_reply(1, conversation_id, 2, "a person answers")
    assert state.waiting_since is None and state.first_reply_created_at is not None


# --- the Chatwoot release imitated (issue 30) -------------------------------------------------------------


async def test_the_version_is_answered_on_get_api_and_the_client_reads_it(sandbox: Sandbox) -> None:
    async with ChatwootClient(sandbox.url, USER, {1: BOT}) as client:
        assert await client.server_version() == "4.18.0"
        sandbox.world.chatwoot_version = "4.15.1"
        assert await client.server_version() == "4.15.1"


async def test_either_spelling_of_the_token_header_is_accepted_as_chatwoot_does(
    sandbox: Sandbox, api: httpx.AsyncClient
) -> None:
    conversation_id = _new(sandbox)
    for header in ("api_access_token", "Api-Access-Token"):
        assert (await api.get(_path(conversation_id), headers={header: USER})).status_code == 200


async def test_an_older_chatwoot_behaves_as_it_did(sandbox: Sandbox) -> None:
    """Before v4.16 the inbox bot does not own a new conversation (#14875); before v4.17 a status activity has no
    `content_attributes.activity` (#14433): the router's turn boundaries and ending (b) depend on both."""
    sandbox.world.chatwoot_version = "4.15.1"
    old = sandbox.world.conversation(1, _new(sandbox))
    assert old.status == "pending" and old.bot_assignee_id is None
    sandbox.human_status(1, old.id, 1, "open")
    activity = [m for m in old.messages if m.message_type == 2][-1]
    assert not (activity.content_attributes or {}).get("activity")
    sandbox.world.chatwoot_version = "4.18.0"
    new = sandbox.world.conversation(1, _new(sandbox))
    assert new.bot_assignee_id is not None
    sandbox.human_status(1, new.id, 1, "open")
    activity = [m for m in new.messages if m.message_type == 2][-1]
    assert activity.content_attributes["activity"]["status"] == "open"
