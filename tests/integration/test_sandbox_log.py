"""The sandbox's request log as the kill-loop verifier reads it (bench/chaos_verify.py): API calls and people's
actions in one order, with the conversation's fields before and after, and what each webhook was answered."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE

USER, BOT = "user-1", "bot-5"


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=SAMPLE, retry_delay_s=0.01) as running:
        yield running


async def test_calls_and_person_actions_share_one_order_with_before_and_after(sandbox: Sandbox) -> None:
    conversation = sandbox.create_conversation(1, 7)
    base = f"{sandbox.url}/api/v1/accounts/1/conversations/{conversation.id}"
    async with httpx.AsyncClient() as http:
        sandbox.customer_message(1, conversation.id, "Hello, I was charged twice")
        labelled = await http.post(f"{base}/labels", json={"labels": ["billing"]}, headers={"api_access_token": BOT})
        assert labelled.status_code == 200
        control = f"{sandbox.url}/_sandbox/conversations/1/{conversation.id}"
        assert (await http.post(f"{control}/labels", json={"user_id": 1, "add": ["vip"]})).json() == ["billing", "vip"]
        assert (await http.post(f"{control}/assign", json={"user_id": 1, "assignee_id": 2})).is_success
        sandbox.add_fault(op="toggle_status", mode="apply_then_fail", status=503)
        failed = await http.post(
            f"{base}/toggle_status", json={"status": "resolved"}, headers={"api_access_token": BOT}
        )
        assert failed.status_code == 503
        log = (await http.get(f"{sandbox.url}/_sandbox/log")).json()
        since = (await http.get(f"{sandbox.url}/_sandbox/log", params={"since_seq": log["last_seq"]})).json()
        only_seq = (await http.get(f"{sandbox.url}/_sandbox/log", params={"include": ""})).json()

    labels_call, status_call = log["api_calls"]
    assert (
        labels_call["applied"]
        and labels_call["before"]["labels"] == []
        and labels_call["after"]["labels"] == ["billing"]
    )
    assert status_call["fault"] == "apply_then_fail" and status_call["applied"]
    assert status_call["after"]["status"] == "resolved"
    actions = [a["action"] for a in log["person_actions"]]
    assert actions == ["customer_message", "labels", "assign"]
    assign = log["person_actions"][2]
    assert assign["before"]["assignee_id"] is None and assign["after"]["assignee_id"] == 2
    order = sorted(
        [(c["applied_seq"], c["op"]) for c in log["api_calls"]]
        + [(a["seq"], a["action"]) for a in log["person_actions"]]
    )
    assert [name for _, name in order] == ["customer_message", "set_labels", "labels", "assign", "toggle_status"]
    assert since["api_calls"] == [] and since["person_actions"] == []
    assert set(only_seq) == {"last_seq"} and only_seq["last_seq"] == log["last_seq"]


async def test_webhook_attempts_keep_the_start_of_the_answer(sandbox: Sandbox) -> None:
    from aiohttp import web

    async def ignore(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "ignored": True})

    app = web.Application()
    app.router.add_post("/hook", ignore)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        sandbox.world.default_webhook_url = f"http://127.0.0.1:{port}/hook"
        conversation = sandbox.create_conversation(1, 7)
        sandbox.customer_message(1, conversation.id, "Hello")
        await sandbox.settle(10)
    finally:
        await runner.cleanup()
    attempts = [a for d in sandbox.log()["webhooks"] for a in d["attempts"]]
    assert attempts and all(a["response"] == '{"ok": true, "ignored": true}' for a in attempts)
