"""The sandbox's realistic mode (issue 30 item 3, sandbox/realism.py): Rack::Attack's per-IP limit and its bare 429,
webhooks as Sidekiq posts them (in parallel, reordered, sometimes twice), `conversation_updated` after bot replies,
outgoing messages without a sender, and an e-mail webhook past the router door's 2 MiB. Real loopback HTTP."""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import hmac
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from sandbox import Sandbox, run_sandbox
from sandbox.realism import PERIOD_S, REALISTIC, Realism
from sandbox.scenario import SAMPLE
from sandbox.world import BOT_FAILURE_TEXT
from streams.sandbox_cmd import add_arguments, given_settings, realism_of
from tests.support.receiver import serving
from tests.support.waiting import within

USER, BOT = "user-1", "bot-5"
DOOR_LIMIT = 2 * 1024 * 1024  # the router door's body limit (handlers/ingress: 413 above it)


@dataclass
class Receiver:
    """A router stand-in with the door's body limit: records every attempt, answers scripted statuses (then 200),
    and can hold the requests it gets until released, to see how many are in flight at once."""

    url: str = ""
    script: list[int] = field(default_factory=list)
    seen: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    hold: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    two_in_flight: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.seen.append((dict(request.headers), b"", 413))
            return web.Response(status=413, text="payload too large")
        self.in_flight += 1
        if self.in_flight >= 2:
            self.two_in_flight.set()
        try:
            if self.hold:
                await self.release.wait()
        finally:
            self.in_flight -= 1
        status = self.script.pop(0) if self.script else 200
        self.seen.append((dict(request.headers), body, status))
        return web.Response(status=status)

    def deliveries(self) -> list[tuple[str, str]]:
        """(delivery id, event) of every attempt, in arrival order."""
        return [(h["X-Chatwoot-Delivery"], json.loads(b)["event"]) for h, b, _ in self.seen if b]

    def payloads(self, event: str) -> list[dict[str, Any]]:
        return [json.loads(b) for _, b, s in self.seen if s == 200 and json.loads(b)["event"] == event]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recorder = Receiver()
    async with serving(recorder.handle, client_max_size=DOOR_LIMIT) as recorder.url:
        yield recorder
        recorder.release.set()


def _scenario() -> dict[str, Any]:
    """The sample installation, with the router bot also on the e-mail inbox (8)."""
    scenario = copy.deepcopy(SAMPLE)
    for inbox in scenario["accounts"][0]["inboxes"]:
        if inbox["id"] == 8:
            inbox["bot_id"] = 5
    return scenario


@pytest.fixture
async def sandbox(receiver: Receiver) -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=_scenario(), webhook_url=receiver.url, retry_delay_s=0.05) as running:
        yield running


@pytest.fixture
async def api(sandbox: Sandbox) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sandbox.url) as client:
        yield client


async def _settings(api: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await api.post("/_sandbox/settings", json=fields)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _path(conversation_id: int, tail: str = "") -> str:
    return f"/api/v1/accounts/1/conversations/{conversation_id}{tail}"


def _new(sandbox: Sandbox, text: str = "Hello, my invoice is wrong", inbox_id: int = 7) -> int:
    conversation = sandbox.create_conversation(1, inbox_id, contact_name="Eve", contact_email="eve@example.org")
    sandbox.customer_message(1, conversation.id, text)
    return conversation.id


async def _start_of_a_window(api: httpx.AsyncClient, sandbox: Sandbox) -> None:
    """Move the sandbox's clock to one second into a fresh rate-limit window, so a test's requests cannot
    straddle a window's end by chance."""
    advance = PERIOD_S - sandbox.world.now() % PERIOD_S + 1
    assert (await api.post("/_sandbox/clock", json={"advance_s": advance})).status_code == 200


# --- Rack::Attack -----------------------------------------------------------------------------------------


async def test_over_the_limit_chatwoot_answers_a_bare_429_until_the_next_window(
    sandbox: Sandbox, api: httpx.AsyncClient
) -> None:
    conversation_id = _new(sandbox)
    assert (await _settings(api, rate_limit=5))["rate_limit"] == 5
    await _start_of_a_window(api, sandbox)
    headers = {"api_access_token": BOT}
    answers = [await api.get(_path(conversation_id), headers=headers) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    throttled = await api.get(_path(conversation_id), headers=headers)
    assert throttled.status_code == 429
    assert throttled.headers["content-type"] == "text/plain"
    assert throttled.content == b"Retry later\n"
    assert "retry-after" not in throttled.headers
    assert (await api.get("/api")).status_code == 429  # Rack::Attack counts every request, GET /api too
    # the control API and System One are other servers: never throttled
    assert (await api.get("/_sandbox/stats")).status_code == 200
    systemone = await api.post("/v1/systemone", json={}, headers={"authorization": "Bearer jev-key"})
    assert systemone.status_code == 400

    stats = (await api.get("/_sandbox/stats")).json()
    assert stats["throttled"] == 2 and stats["throttled_by_ip"] == {"127.0.0.1": 2}
    calls = (await api.get("/_sandbox/log", params={"include": "api_calls"})).json()["api_calls"]
    refused = [c for c in calls if c["status"] == 429]
    assert [(c["op"], c["token"], c.get("throttled")) for c in refused] == [
        ("get_conversation", "bot", True),
        ("server_version", "none", True),
    ]
    assert all("applied_seq" not in c for c in refused)  # refused before Chatwoot saw them

    await api.post("/_sandbox/clock", json={"advance_s": PERIOD_S})  # the next window: counting starts again
    assert (await api.get(_path(conversation_id), headers=headers)).status_code == 200
    assert (await api.get("/_sandbox/stats")).json()["throttled"] == 2


async def test_the_limit_is_per_client_ip(sandbox: Sandbox, api: httpx.AsyncClient) -> None:
    """Two client addresses (127.0.0.1 and 127.0.0.2, both loopback on Linux) count apart."""
    await _settings(api, rate_limit=2)
    await _start_of_a_window(api, sandbox)
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=sandbox.url, transport=transport) as other:
        first = [(await api.get("/api")).status_code for _ in range(3)]
        second = [(await other.get("/api")).status_code for _ in range(3)]
    assert first == second == [200, 200, 429]
    stats = (await api.get("/_sandbox/stats")).json()
    assert stats["throttled_by_ip"] == {"127.0.0.1": 1, "127.0.0.2": 1}
    assert stats["requests_this_window"] == {"127.0.0.1": 3, "127.0.0.2": 3}


async def test_settings_switch_the_rough_edges_together_or_one_by_one(api: httpx.AsyncClient) -> None:
    kind = await _settings(api)
    assert (kind["rate_limit"], kind["concurrent_webhooks"], kind["webhook_duplicates"]) == (0, False, 0.0)
    mixed = await _settings(api, realistic=True, rate_limit=20)
    assert {k: mixed[k] for k in REALISTIC} == {**REALISTIC, "rate_limit": 20}
    refused = await api.post("/_sandbox/settings", json={"webhook_duplicates": 2, "activity_delay_ms": 5})
    assert refused.status_code == 400
    unchanged = await _settings(api)
    assert unchanged["webhook_duplicates"] == REALISTIC["webhook_duplicates"] and unchanged["activity_delay_ms"] == 0
    assert (await _settings(api, realistic=False))["waiting_since_updates"] is False


def test_the_command_line_flags_and_realistic_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert realism_of(parser.parse_args([])).switches() == Realism().switches()
    assert realism_of(parser.parse_args(["--realistic"])).switches() == REALISTIC
    tuned = realism_of(parser.parse_args(["--realistic", "--rate-limit", "20", "--no-concurrent-webhooks"]))
    assert (tuned.rate_limit, tuned.concurrent_webhooks, tuned.waiting_since_updates) == (20, False, True)
    single = realism_of(parser.parse_args(["--webhook-duplicates", "0.5", "--seed", "3"]))
    assert (single.webhook_duplicates, single.rate_limit, single.seed) == (0.5, 0, 3)


async def test_a_scenario_can_carry_the_settings_and_given_flags_win(receiver: Receiver) -> None:
    scenario = {**_scenario(), "settings": {"realistic": True, "rate_limit": 7, "chatwoot_version": "4.15.1"}}
    async with run_sandbox(scenario=scenario, webhook_url=receiver.url) as sandbox:
        assert sandbox.realism.switches() == {**REALISTIC, "rate_limit": 7}
        assert sandbox.world.chatwoot_version == "4.15.1"
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        assert given_settings(parser.parse_args([])) == {}  # no flag: the scenario's settings stand
        sandbox.configure(
            given_settings(parser.parse_args(["--no-concurrent-webhooks", "--chatwoot-version", "4.18.0"]))
        )
        assert (sandbox.realism.concurrent_webhooks, sandbox.realism.rate_limit) == (False, 7)
        assert sandbox.world.chatwoot_version == "4.18.0"


# --- deliveries as Sidekiq makes them ---------------------------------------------------------------------


async def test_one_conversations_webhooks_are_in_flight_at_once(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    """The kind sandbox posts a conversation's next webhook only after the last was answered; as Sidekiq jobs
    they race: both of a first message's events (waiting_since, then the message) are posted before either
    is answered."""
    await _settings(api, concurrent_webhooks=True)
    receiver.hold = True
    _new(sandbox)
    async with within(10, "both webhooks of one conversation in flight at once"):
        await receiver.two_in_flight.wait()
    receiver.release.set()
    await sandbox.settle()
    assert sorted(event for _, event in receiver.deliveries()) == ["conversation_updated", "message_created"]


async def test_jittered_deliveries_arrive_reordered_and_settle_waits_for_all(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    await _settings(api, concurrent_webhooks=True, webhook_jitter_ms=500, seed=7)
    for n in range(6):
        _new(sandbox, f"Question number {n}")
    await sandbox.settle()  # returns only when every delayed job has been answered
    sent = [(d.delivery_id, d.event.event) for d in sandbox.dispatcher.deliveries]
    assert len(sent) == 12 and sorted(receiver.deliveries()) == sorted(sent)
    assert receiver.deliveries() != sent  # 12 jobs each started within 500 ms: not in the order they were made
    assert (await api.get("/_sandbox/stats")).json()["webhooks_pending"] == 0


async def test_a_job_run_twice_posts_the_same_delivery_again(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    """A re-run job re-sends its payload under its delivery id (chatwoot.md §2: the id is made when the job is
    enqueued, so duplicates share it); each attempt is stamped and signed anew."""
    await _settings(api, concurrent_webhooks=True, webhook_jitter_ms=200, webhook_duplicates=1.0)
    _new(sandbox)
    await sandbox.settle()
    by_id = Counter(delivery_id for delivery_id, _ in receiver.deliveries())
    assert len(by_id) == 2 and set(by_id.values()) == {2}
    for delivery_id in by_id:
        bodies = {body for headers, body, _ in receiver.seen if headers["X-Chatwoot-Delivery"] == delivery_id}
        assert len(bodies) == 1  # the same payload, byte for byte
    for headers, body, _ in receiver.seen:
        timestamp = headers["X-Chatwoot-Timestamp"]
        expected = hmac.new(b"secret-5", timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert headers["X-Chatwoot-Signature"] == f"sha256={expected}"
    logged = (await api.get("/_sandbox/log", params={"include": "webhooks"})).json()["webhooks"]
    assert sum(1 for d in logged if d.get("duplicate")) == 2 and all(d["outcome"] == "delivered" for d in logged)
    stats = (await api.get("/_sandbox/stats")).json()
    assert (stats["webhook_deliveries"], stats["webhook_duplicates"]) == (4, 2)


async def test_concurrent_jobs_still_retry_a_500_under_the_same_id(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    await _settings(api, concurrent_webhooks=True)
    receiver.script = [500]
    _new(sandbox)
    await sandbox.settle()
    retried = [d for d in sandbox.dispatcher.deliveries if len(d.attempts) > 1]
    assert len(retried) == 1 and [a["status"] for a in retried[0].attempts] == [500, 200]
    ids = [delivery_id for delivery_id, _ in receiver.deliveries()]
    assert ids.count(retried[0].delivery_id) == 2


# --- what a real Chatwoot sends besides ---------------------------------------------------------------------


async def test_a_bot_reply_clears_waiting_since_and_announces_it(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    await _settings(api, waiting_since_updates=True)
    conversation_id = _new(sandbox)
    await sandbox.settle()
    receiver.seen.clear()
    headers = {"api_access_token": BOT}
    reply = await api.post(_path(conversation_id, "/messages"), json={"content": "Let me check."}, headers=headers)
    assert reply.status_code == 200
    await sandbox.settle()
    assert [event for _, event in receiver.deliveries()] == ["message_created", "conversation_updated"]
    (message,) = receiver.payloads("message_created")
    assert message["conversation"]["waiting_since"] > 0  # built before the wait was cleared, as in Chatwoot
    (updated,) = receiver.payloads("conversation_updated")
    changed = {name: value for entry in updated["changed_attributes"] for name, value in entry.items()}
    assert set(changed) == {"waiting_since", "updated_at"} and changed["waiting_since"]["current_value"] is None
    assert changed["waiting_since"]["previous_value"] is not None and updated["waiting_since"] == 0
    state = sandbox.world.conversation(1, conversation_id)
    assert state.waiting_since is None and state.first_reply_created_at is None  # not a human's first reply

    receiver.seen.clear()  # nothing left to clear: a second reply and a private note announce only themselves
    await api.post(_path(conversation_id, "/messages"), json={"content": "Still on it."}, headers=headers)
    await api.post(_path(conversation_id, "/messages"), json={"content": "note", "private": True}, headers=headers)
    await sandbox.settle()
    assert [event for _, event in receiver.deliveries()] == ["message_created", "message_created"]


async def test_automation_messages_and_echoes_have_no_sender(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    conversation_id = _new(sandbox)
    await sandbox.settle()
    receiver.seen.clear()
    control = f"/_sandbox/conversations/1/{conversation_id}"
    automated = await api.post(f"{control}/automation", json={"content": "We are on it", "automation_rule_id": 4})
    assert automated.status_code == 200 and "sender" not in automated.json()
    state = sandbox.world.conversation(1, conversation_id)
    assert state.waiting_since is not None  # an automation's message is nobody's reply
    echoed = await api.post(f"{control}/echo", json={"content": "Sent from my phone"})
    assert echoed.status_code == 200 and echoed.json()["status"] == "delivered"
    assert state.waiting_since is None and state.first_reply_created_at is not None  # a person's reply, by phone
    await sandbox.settle()

    automation, echo = receiver.payloads("message_created")
    for payload, attributes in ((automation, {"automation_rule_id": 4}), (echo, {"external_echo": True})):
        assert (payload["message_type"], payload["private"], payload["sender"]) == ("outgoing", False, None)
        assert payload["content_attributes"] == attributes
        latest = payload["conversation"]["messages"][0]
        assert (latest["id"], latest["sender"], latest["sender_type"]) == (payload["id"], None, None)
    listed = await api.get(_path(conversation_id, "/messages"), headers={"api_access_token": USER})
    rows = {row["id"]: row for row in listed.json()["payload"]}
    for payload in (automation, echo):
        row = rows[payload["id"]]
        assert "sender" not in row and (row["message_type"], row["private"]) == (1, False)
        assert row["content_attributes"] == payload["content_attributes"]
    actions = (await api.get("/_sandbox/log", params={"include": "person_actions"})).json()["person_actions"]
    assert [a["action"] for a in actions][-2:] == ["automation_message", "external_echo"]


async def test_an_inbox_automation_answers_each_new_conversation_once(receiver: Receiver) -> None:
    scenario = _scenario()
    scenario["accounts"][0]["inboxes"][0]["automation_message"] = "Thanks, we got your message."
    async with run_sandbox(scenario=scenario, webhook_url=receiver.url, retry_delay_s=0.05) as sandbox:
        conversation_id = _new(sandbox)
        sandbox.customer_message(1, conversation_id, "Anyone there?")
        await sandbox.settle()
    messages = sandbox.world.conversation(1, conversation_id).messages
    outgoing = [m for m in messages if m.message_type == 1]
    assert [(m.content, m.sender, m.content_attributes) for m in outgoing] == [
        ("Thanks, we got your message.", None, {"automation_rule_id": 1})
    ]
    assert [m.message_type for m in messages] == [0, 1, 0]  # after the first incoming message, before the next


async def test_a_3_mib_email_webhook_refused_413_is_final_and_opens_the_conversation(
    sandbox: Sandbox, receiver: Receiver, api: httpx.AsyncClient
) -> None:
    conversation = sandbox.create_conversation(1, 8, contact_email="long@example.org")
    assert conversation.status == "pending" and conversation.bot_assignee_id == 5
    made = await api.post(f"/_sandbox/conversations/1/{conversation.id}/large_email", json={})
    assert made.status_code == 200, made.text
    sizes = made.json()
    assert sizes["webhook_bytes"] > 3 * 1024 * 1024
    await sandbox.settle()

    refused = [(headers, status) for headers, _, status in receiver.seen if status == 413]
    assert len(refused) == 1  # no retry: only 429 and 500 are retried
    assert int(refused[0][0]["Content-Length"]) == sizes["webhook_bytes"]
    (delivery,) = [d for d in sandbox.dispatcher.deliveries if d.event.event == "message_created"]
    assert [a["status"] for a in delivery.attempts] == [413] and delivery.outcome == "failed"
    # Chatwoot's fallback: the pending conversation is opened, its bot kept, with the system's activity
    assert (conversation.status, conversation.bot_assignee_id) == ("open", 5)
    assert [m.content for m in conversation.messages if m.message_type == 2] == [BOT_FAILURE_TEXT]
    message = next(m for m in conversation.messages if m.id == sizes["message_id"])
    html = message.content_attributes["email"]["html_content"]
    assert message.content_type == "incoming_email" and html["full"] == html["reply"]
    assert len(html["full"]) == sizes["html_bytes"]

    website = _new(sandbox)
    elsewhere = await api.post(f"/_sandbox/conversations/1/{website}/large_email", json={})
    assert elsewhere.status_code == 422  # an e-mail needs an e-mail inbox
