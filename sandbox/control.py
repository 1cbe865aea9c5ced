"""The sandbox's control API under `/_sandbox/` (JSON in, JSON out; errors are `{"error": ...}` with 4xx).

GET    /_sandbox/state                          everything: conversations (messages, labels, status,
                                                assignee), webhooks sent (attempts, outcome), API calls
                                                received, System One calls, faults, clock offset
POST   /_sandbox/scenario                       load a scenario (see scenario.py); clears conversations
POST   /_sandbox/conversations                  {account_id, inbox_id, contact_name?, contact_email?,
                                                blocked?, assignee_id?, subject?, messages?: [text...]}
                                                → the conversation (messages are incoming, in order)
POST   /_sandbox/conversations/{a}/{c}/incoming {content, email?: {subject, quoted_text, quoted_html,
                                                auto_reply}, content_attributes?} → the message
POST   /_sandbox/conversations/{a}/{c}/reply    {user_id, content, private?} → the message
POST   /_sandbox/conversations/{a}/{c}/automation  {content, automation_rule_id?: 1} an automation rule's
                                                message: outgoing, public, no sender → the message
POST   /_sandbox/conversations/{a}/{c}/echo     {content} a WhatsApp/Instagram echo of a reply sent from the
                                                phone: outgoing, public, no sender, external_echo → the message
POST   /_sandbox/conversations/{a}/{c}/large_email  {min_webhook_bytes?: 3 MiB, subject?} (e-mail inboxes) an
                                                HTML mail whose message_created webhook passes the size →
                                                {message_id, text_bytes, html_bytes, webhook_bytes}
POST   /_sandbox/conversations/{a}/{c}/status   {user_id, status?} as a person would (toggle_status)
POST   /_sandbox/conversations/{a}/{c}/assign   {user_id, assignee_id|null} as a person would
POST   /_sandbox/conversations/{a}/{c}/labels   {user_id, labels? | add?, remove?} as a person would
                                                (`labels` replaces the list) → the labels
DELETE /_sandbox/conversations/{a}/{c}          delete the conversation (the API then answers JSON 404)
DELETE /_sandbox/conversations/{a}/{c}/messages/{m}   delete a message (`deleted`, message_updated)
GET    /_sandbox/conversations/{a}/{c}          one conversation's state
GET    /_sandbox/log?since_seq=N&include=…      the request log without conversations: API calls (each
                                                with `seq`/`at` on arrival, `applied_seq`/`applied_at`,
                                                `before`/`after` fields of its conversation when applied,
                                                `fault` when a rule fired), control-API actions of
                                                customers and people (`person_actions`, same `seq`),
                                                webhooks (attempts with the answer's start), System One
                                                calls; only entries with `seq` > N; `last_seq`;
                                                `&include=api_calls,webhooks,…` picks the parts
POST   /_sandbox/faults                         {op, mode?, status?, delay_ms?, times?, content_type?,
                                                account_id?, conversation_id?} (see faults.py)
DELETE /_sandbox/faults                         remove every fault rule
POST   /_sandbox/clock                          {advance_s}: move the sandbox's clock forward
POST   /_sandbox/settle                         {timeout_s?}: wait until queued webhooks are finished
POST   /_sandbox/settings                       {activity_delay_ms?, webhook_retry_delay_ms?, chatwoot_version?,
                                                realistic?, rate_limit?, concurrent_webhooks?,
                                                webhook_jitter_ms?, webhook_duplicates?,
                                                waiting_since_updates?, seed?} → all of them (realism.py;
                                                `realistic` first, then the single fields)
GET    /_sandbox/stats                          {throttled, throttled_by_ip, rate_limit, window_start,
                                                requests_this_window, webhook_deliveries, webhook_duplicates,
                                                webhooks_pending, realism}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sandbox import views
from sandbox.core import SANDBOX, Sandbox
from sandbox.world import ApiError

Action = Callable[["Sandbox", dict[str, Any], dict[str, int]], Any]


def _control(action: Action) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        sandbox = request.app[SANDBOX]
        body: dict[str, Any] = {}
        if request.can_read_body:
            try:
                parsed = await request.json()
            except ValueError:
                return web.json_response({"error": "body is not JSON"}, status=400)
            if not isinstance(parsed, dict):
                return web.json_response({"error": "body must be an object"}, status=400)
            body = parsed
        try:
            ids = {k: int(v) for k, v in request.match_info.items()}
            result = action(sandbox, body, ids)
            if hasattr(result, "__await__"):
                result = await result
        except ApiError as error:
            return web.json_response(error.body or {"error": f"HTTP {error.status}"}, status=error.status)
        except (KeyError, TypeError, ValueError) as error:
            return web.json_response({"error": f"bad request: {error}"}, status=400)
        return web.json_response(result)

    return handle


def _state(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.snapshot()


def _scenario(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    sandbox.load(body)
    return {"ok": True}


def _create(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    conversation = sandbox.create_conversation(
        int(body["account_id"]),
        int(body["inbox_id"]),
        contact_name=body.get("contact_name", "Sandbox Customer"),
        contact_email=body.get("contact_email"),
        blocked=bool(body.get("blocked", False)),
        assignee_id=body.get("assignee_id"),
        subject=body.get("subject"),
        contact_id=body.get("contact_id"),
    )
    for text in body.get("messages", []):
        sandbox.customer_message(conversation.account_id, conversation.id, str(text))
    return sandbox.conversation_state(conversation)


def _incoming(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    message = sandbox.customer_message(
        ids["a"],
        ids["c"],
        body.get("content"),
        email=body.get("email"),
        content_attributes=body.get("content_attributes"),
    )
    return views.message_rest(sandbox.world, message)


def _reply(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    message = sandbox.human_reply(
        ids["a"], ids["c"], int(body["user_id"]), str(body["content"]), private=bool(body.get("private"))
    )
    return views.message_rest(sandbox.world, message)


def _automation(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    rule = int(body.get("automation_rule_id", 1))
    message = sandbox.automation_message(ids["a"], ids["c"], str(body["content"]), automation_rule_id=rule)
    return views.message_rest(sandbox.world, message)


def _echo(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return views.message_rest(sandbox.world, sandbox.external_echo(ids["a"], ids["c"], str(body["content"])))


def _large_email(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    options: dict[str, Any] = {}
    if "min_webhook_bytes" in body:
        options["min_webhook_bytes"] = int(body["min_webhook_bytes"])
    if "subject" in body:
        options["subject"] = str(body["subject"])
    return sandbox.large_email(ids["a"], ids["c"], **options)


def _status(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.human_status(ids["a"], ids["c"], int(body["user_id"]), body.get("status"))


def _assign(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.human_assign(ids["a"], ids["c"], int(body["user_id"]), body["assignee_id"])


def _labels(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    lists = {name: body.get(name) for name in ("labels", "add", "remove")}
    for name, value in lists.items():
        if value is not None and not isinstance(value, list):
            raise ValueError(f"{name} must be a list")
    return sandbox.human_labels(
        ids["a"], ids["c"], int(body["user_id"]), labels=lists["labels"], add=lists["add"], remove=lists["remove"]
    )


def _delete(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    sandbox.delete_conversation(ids["a"], ids["c"])
    return {"ok": True}


def _delete_message(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return views.message_rest(sandbox.world, sandbox.delete_message(ids["a"], ids["c"], ids["m"]))


def _one(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.conversation_state(sandbox.world.conversation(ids["a"], ids["c"]))


def _add_fault(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.add_fault(**body).to_json()


def _clear_faults(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    sandbox.faults.clear()
    return {"ok": True}


def _clock(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    sandbox.world.clock_offset_s += float(body["advance_s"])
    sandbox.world.expire_snoozes()
    return {"clock_offset_s": sandbox.world.clock_offset_s}


def _settings(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.configure(body)


def _stats(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    return sandbox.stats()


async def _settle(sandbox: Sandbox, body: dict[str, Any], ids: dict[str, int]) -> Any:
    try:
        await sandbox.settle(float(body.get("timeout_s", 30)))
    except TimeoutError:
        raise ApiError(504, {"error": "webhooks still pending"}) from None
    return {"ok": True}


def add_routes(app: web.Application) -> None:
    conv = "/_sandbox/conversations/{a:\\d+}/{c:\\d+}"
    app.router.add_get("/_sandbox/state", _control(_state))
    app.router.add_get("/_sandbox/log", _log_handler)
    app.router.add_post("/_sandbox/scenario", _control(_scenario))
    app.router.add_post("/_sandbox/conversations", _control(_create))
    app.router.add_get(conv, _control(_one))
    app.router.add_delete(conv, _control(_delete))
    app.router.add_post(conv + "/incoming", _control(_incoming))
    app.router.add_post(conv + "/reply", _control(_reply))
    app.router.add_post(conv + "/automation", _control(_automation))
    app.router.add_post(conv + "/echo", _control(_echo))
    app.router.add_post(conv + "/large_email", _control(_large_email))
    app.router.add_post(conv + "/status", _control(_status))
    app.router.add_post(conv + "/assign", _control(_assign))
    app.router.add_post(conv + "/labels", _control(_labels))
    app.router.add_delete(conv + "/messages/{m:\\d+}", _control(_delete_message))
    app.router.add_post("/_sandbox/faults", _control(_add_fault))
    app.router.add_delete("/_sandbox/faults", _control(_clear_faults))
    app.router.add_post("/_sandbox/clock", _control(_clock))
    app.router.add_post("/_sandbox/settle", _control(_settle))
    app.router.add_post("/_sandbox/settings", _control(_settings))
    app.router.add_get("/_sandbox/stats", _control(_stats))


async def _log_handler(request: web.Request) -> web.StreamResponse:
    try:
        since = int(request.query.get("since_seq") or 0)
    except ValueError:
        return web.json_response({"error": "since_seq must be an integer"}, status=400)
    raw = request.query.get("include")
    include = frozenset(part for part in raw.split(",") if part) if raw is not None else None
    return web.json_response(request.app[SANDBOX].log(since, include))
