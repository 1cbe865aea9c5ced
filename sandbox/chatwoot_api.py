"""The Chatwoot REST endpoints the router uses (chatwoot.md §4), over the sandbox's world.

Every request is logged (operation, path, token kind, status) and passes the fault plan: a rule can answer
before the request is applied, after it was applied, or drop the connection after applying it. In front of them
all sits Rack::Attack's per-IP throttle (`rate_limit`, off unless `Realism.rate_limit` is set).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler as NextHandler

from sandbox import views
from sandbox.core import SANDBOX, SYSTEMONE_PATH, Sandbox
from sandbox.faults import Fault
from sandbox.model import ACTIVITY, Bot, User
from sandbox.realism import THROTTLED_BODY
from sandbox.world import NOT_FOUND, ApiError, World

Actor = User | Bot
Handler = Callable[["Call"], Any]

PER_PAGE_CONVERSATIONS = 25
PER_PAGE_MESSAGES = 20
INT_MAX = 2_147_483_647


class Call:
    """What an endpoint needs: the world, the authenticated actor, ids from the path, the JSON body."""

    def __init__(self, world: World, actor: Actor, request: web.Request, account_id: int, body: dict[str, Any]) -> None:
        self.world = world
        self.actor = actor
        self.request = request
        self.account_id = account_id
        self.body = body

    @property
    def conversation_id(self) -> int:
        return _int(self.request.match_info["conversation"])

    def conversation(self) -> Any:
        """The path's conversation, if the caller may see it (a Pundit denial is a 401 in Chatwoot)."""
        conversation = self.world.conversation(self.account_id, self.conversation_id)
        if isinstance(self.actor, User) and not self.actor.can_see(self.account_id, conversation.inbox_id):
            raise ApiError(401, {"error": "You are not authorized to do this action"})
        return conversation

    def query(self, name: str) -> str | None:
        return self.request.query.get(name)


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ApiError(404, NOT_FOUND) from None


def _authenticate(world: World, request: web.Request, account_id: int, bot_ok: bool) -> Actor:
    """Token → user or bot, with Chatwoot's 401/404 answers (§4.0)."""
    token = _token_header(request)
    if token is None:
        raise ApiError(401, {"errors": ["You need to sign in or sign up before continuing."]})
    actor = world.token_owner(token)
    if actor is None:
        raise ApiError(401, {"error": "Invalid Access Token"})
    if isinstance(actor, Bot) and not bot_ok:
        raise ApiError(401, {"error": "Access to this endpoint is not authorized for bots"})
    if account_id not in world.accounts:
        raise ApiError(404, NOT_FOUND)
    if isinstance(actor, User) and account_id not in actor.accounts:
        raise ApiError(401, {"error": "You are not authorized to access this account"})
    if isinstance(actor, Bot) and actor.account_id != account_id:
        linked = any(i.bot_id == actor.id and i.account_id == account_id for i in world.inboxes.values())
        if not linked:
            raise ApiError(401, {"error": "Bot is not authorized to access this account"})
    return actor


def fault_response(fault: Fault, request: web.Request) -> web.Response:
    headers = {}
    if 300 <= fault.status < 400:
        headers["Location"] = "http://127.0.0.1:9/elsewhere"
    if fault.mode == "respond":
        if fault.content_type == "json":
            return web.json_response(fault.body, status=fault.status, headers=headers)
        return web.Response(text=str(fault.body), status=fault.status, headers=headers)
    if fault.content_type == "json":
        return web.json_response({"error": "sandbox fault"}, status=fault.status, headers=headers)
    return web.Response(text="sandbox fault", status=fault.status, headers=headers)


def drop_connection(request: web.Request) -> web.Response:
    """Close the socket without answering: the client sees a network error after the change was applied."""
    if request.transport is not None:
        request.transport.close()
    return web.Response(status=500)


async def apply_faults(
    request: web.Request, fault: Fault | None, apply: Callable[[], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Run `apply` under a fault rule (see faults.py)."""
    if fault is not None and fault.delay_ms:
        await asyncio.sleep(fault.delay_ms / 1000)
    if fault is not None and fault.mode in ("fail", "respond"):
        return fault_response(fault, request)
    response = await apply()
    if fault is not None and fault.mode == "apply_then_fail":
        return fault_response(fault, request)
    if fault is not None and fault.mode == "apply_then_drop":
        return drop_connection(request)
    return response


def _target(world: World, account_id: int, conversation: str | None) -> Any:
    """The path's conversation for the request log, if it exists."""
    if conversation is None or not conversation.isdigit():
        return None
    return world.conversations.get((account_id, int(conversation)))


def _token_kind(token: str | None, owner: Actor | None) -> str:
    if token is None:
        return "none"
    if owner is None:
        return "invalid"
    return "bot" if isinstance(owner, Bot) else "user"


def _token_header(request: web.Request) -> str | None:
    """The access token, under either spelling Chatwoot reads: `api_access_token` or `Api-Access-Token` (Rails
    sees both as HTTP_API_ACCESS_TOKEN; a default nginx drops the first, so the router sends the second)."""
    return request.headers.get("api_access_token") or request.headers.get("Api-Access-Token")


def _call_entry(sandbox: Sandbox, request: web.Request, op: str) -> dict[str, Any]:
    """A request's entry in the API log, made on arrival."""
    token = _token_header(request)
    owner = sandbox.world.token_owner(token) if token else None
    return {
        "op": op,
        "method": request.method,
        "path": request.path,
        "query": dict(request.query),
        "token": "bot" if isinstance(owner, Bot) else "user" if owner else "none" if not token else "bad",
        "actor_id": owner.id if owner else None,
        "status": None,
        # the order of everything the sandbox saw (shared with control-API actions) and when
        "seq": sandbox.next_seq(),
        "at": time.time(),
    }


_OPS: dict[Any, str] = {}
"""Each route handler's operation name, so a request the throttle refuses is logged under its operation."""


def endpoint(op: str, *, bot_ok: bool) -> Callable[[Handler], Callable[[web.Request], Awaitable[Any]]]:
    def wrap(handler: Handler) -> Callable[[web.Request], Awaitable[Any]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            sandbox = request.app[SANDBOX]
            entry = _call_entry(sandbox, request, op)
            sandbox.calls.append(entry)
            response: web.StreamResponse
            try:
                account_id = _int(request.match_info["account"])
                actor = _authenticate(sandbox.world, request, account_id, bot_ok)
                conversation = request.match_info.get("conversation")
                fault = sandbox.faults.take(op, account_id, _int(conversation) if conversation else None)
                if fault is not None:
                    entry["fault"] = fault.mode
                body: dict[str, Any] = {}
                if request.method == "POST" and request.can_read_body:
                    try:
                        parsed = await request.json()
                    except ValueError:
                        raise ApiError(422, {"error": "invalid JSON"}) from None
                    body = parsed if isinstance(parsed, dict) else {}
                    entry["body"] = parsed

                async def apply() -> web.StreamResponse:
                    # when the request takes effect, and the conversation's fields before and after it
                    entry["applied_seq"] = sandbox.next_seq()
                    entry["applied_at"] = time.time()
                    target = _target(sandbox.world, account_id, conversation)
                    if target is not None:
                        entry["before"] = sandbox.summary(target)
                    try:
                        result = handler(Call(sandbox.world, actor, request, account_id, body))
                        entry["applied"] = True  # the handler ran to the end: its change (if any) was made
                    finally:
                        if target is not None:
                            entry["after"] = sandbox.summary(target)
                    return web.json_response(result)

                response = await apply_faults(request, fault, apply)
            except ApiError as error:
                if error.body is None:
                    response = web.Response(status=error.status, text="Internal Server Error")
                else:
                    response = web.json_response(error.body, status=error.status)
            entry["status"] = response.status
            return response

        _OPS[handle] = op
        return handle

    return wrap


@web.middleware
async def rate_limit(request: web.Request, handler: NextHandler) -> web.StreamResponse:
    """Rack::Attack's `req/ip` throttle: it runs before Rails routes anything, so it counts every Chatwoot
    request, `GET /api` and unknown paths included (not the sandbox's control API, nor System One, which are
    other servers in truth). A refused request is answered as rack-attack's default responder does, 429 with
    `Content-Type: text/plain` and "Retry later" and no Retry-After, and logged like any call, with
    `throttled: true` (a throttled `GET /api` too, although its answered calls are not logged)."""
    sandbox = request.app[SANDBOX]
    other_server = request.path.startswith(("/_sandbox/", SYSTEMONE_PATH))
    if other_server or sandbox.limiter.admit(request.remote or "unknown", sandbox.world.now()):
        return await handler(request)
    op = _OPS.get(request.match_info.handler, "unknown")
    entry = _call_entry(sandbox, request, op)
    entry.update(status=429, throttled=True)
    sandbox.calls.append(entry)
    return web.Response(status=429, body=THROTTLED_BODY, headers={"Content-Type": "text/plain"})


# --- conversations ----------------------------------------------------------------------------------------


def _filtered(call: Call) -> tuple[list[Any], dict[str, int]]:
    status = call.query("status") or "open"
    actor = call.actor
    rows = [
        c
        for c in call.world.conversations.values()
        if c.account_id == call.account_id and (isinstance(actor, Bot) or actor.can_see(c.account_id, c.inbox_id))
    ]
    if status != "all":
        rows = [c for c in rows if c.status == status]
    inbox = call.query("inbox_id")
    if inbox:
        rows = [c for c in rows if str(c.inbox_id) == inbox]
    me = call.actor.id
    counts = {
        "mine_count": sum(1 for c in rows if c.assignee_id == me),
        "assigned_count": sum(1 for c in rows if c.assignee_id or c.bot_assignee_id),
        "unassigned_count": sum(1 for c in rows if not c.assignee_id and not c.bot_assignee_id),
        "all_count": len(rows),
    }
    kind = call.query("assignee_type")
    if kind == "me":
        rows = [c for c in rows if c.assignee_id == me]
    elif kind == "unassigned":
        rows = [c for c in rows if not c.assignee_id and not c.bot_assignee_id]
    elif kind == "assigned":
        rows = [c for c in rows if c.assignee_id or c.bot_assignee_id]
    rows.sort(key=lambda c: (-c.last_activity_at, -c.id))
    return rows, counts


@endpoint("list_conversations", bot_ok=False)
def list_conversations(call: Call) -> Any:
    rows, counts = _filtered(call)
    try:
        page = max(1, int(call.query("page") or 1))
    except ValueError:
        page = 1
    chunk = rows[(page - 1) * PER_PAGE_CONVERSATIONS : page * PER_PAGE_CONVERSATIONS]
    return {"data": {"meta": counts, "payload": [views.conversation_rest(call.world, c) for c in chunk]}}


@endpoint("conversations_meta", bot_ok=False)
def conversations_meta(call: Call) -> Any:
    return {"meta": _filtered(call)[1]}


@endpoint("get_conversation", bot_ok=True)
def get_conversation(call: Call) -> Any:
    return views.conversation_rest(call.world, call.conversation())


@endpoint("toggle_status", bot_ok=True)
def toggle_status(call: Call) -> Any:
    return call.world.toggle_status(
        call.conversation(), call.actor, call.body.get("status"), call.body.get("snoozed_until")
    )


@endpoint("assign", bot_ok=True)
def assign(call: Call) -> Any:
    conversation = call.conversation()
    return views.assignee_json(call.world.assign(conversation, call.actor, call.body), conversation.account_id)


@endpoint("get_labels", bot_ok=True)
def get_labels(call: Call) -> Any:
    return {"payload": list(call.conversation().labels)}


@endpoint("set_labels", bot_ok=True)
def set_labels(call: Call) -> Any:
    conversation = call.conversation()
    labels = call.body.get("labels")
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ApiError(422, {"error": "param is missing or the value is empty: labels"})
    return {"payload": call.world.set_labels(conversation, call.actor, labels)}


# --- messages ---------------------------------------------------------------------------------------------


def _int_param(call: Call, name: str) -> int | None:
    raw = call.query(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


@endpoint("list_messages", bot_ok=False)
def list_messages(call: Call) -> Any:
    """MessageFinder's paging (§4.6): latest 20, `before` (newest 20 below), `after` (first 100 above)."""
    conversation = call.conversation()
    messages = call.world.sorted_messages(conversation)
    if call.query("filter_internal_messages") == "true":
        messages = [m for m in messages if not m.private and m.message_type != ACTIVITY]
    before, after = _int_param(call, "before"), _int_param(call, "after")
    if before is not None and before > INT_MAX:
        before = None
    if after is not None and after > INT_MAX:
        messages = []
    elif after is not None and before is not None:
        messages = [m for m in messages if after <= m.id < before][:1000]
    elif after is not None:
        messages = [m for m in messages if m.id > after][:100]
    elif before is not None:
        messages = [m for m in messages if m.id < before][-PER_PAGE_MESSAGES:]
    else:
        messages = messages[-PER_PAGE_MESSAGES:]
    contact = call.world.contacts[conversation.contact_id]
    meta: dict[str, Any] = {
        "labels": list(conversation.labels),
        "additional_attributes": conversation.additional_attributes,
        "contact": views.contact_push(contact),
        "agent_last_seen_at": None,
        "assignee_last_seen_at": None,
    }
    if conversation.assignee_id is not None:
        meta["assignee"] = views.user_push(call.world.users[conversation.assignee_id])
    return {"meta": meta, "payload": [views.message_rest(call.world, m) for m in messages]}


@endpoint("create_message", bot_ok=True)
def create_message(call: Call) -> Any:
    message = call.world.api_create_message(call.conversation(), call.actor, call.body)
    return views.message_rest(call.world, message)


# --- account resources ------------------------------------------------------------------------------------


@endpoint("get_inbox_bot", bot_ok=False)
def get_inbox_bot(call: Call) -> Any:
    inbox = call.world.inboxes.get(_int(call.request.match_info["inbox"]))
    if inbox is None or inbox.account_id != call.account_id:
        raise ApiError(404, NOT_FOUND)
    if inbox.bot_id is None:
        return {}
    bot = call.world.bots[inbox.bot_id]
    data = views.bot_slim(bot)
    data.update({"bot_config": {}, "account_id": bot.account_id, "system_bot": bot.account_id is None})
    admin = isinstance(call.actor, User) and call.actor.accounts.get(call.account_id) == "administrator"
    if admin and bot.account_id is not None:
        data.update({"access_token": bot.access_token, "secret": bot.secret})
    return {"agent_bot": data}


@endpoint("list_canned", bot_ok=False)
def list_canned(call: Call) -> Any:
    rows = [c for c in call.world.canned.values() if c.account_id == call.account_id]
    search = (call.query("search") or "").lower()
    if search:
        rows = [c for c in rows if search in c.short_code.lower() or search in c.content.lower()]
        rows.sort(key=lambda c: search not in c.short_code.lower())
    return [views.canned_json(c) for c in rows]


@endpoint("list_agents", bot_ok=False)
def list_agents(call: Call) -> Any:
    users = [u for u in call.world.users.values() if call.account_id in u.accounts]
    users.sort(key=lambda u: u.name.lower())
    return [views.agent_json(u, call.account_id) for u in users]


async def server_version(request: web.Request) -> web.StreamResponse:
    """`GET /api` (no token): the installation's version (`app/controllers/api_controller.rb`)."""
    world = request.app[SANDBOX].world
    return web.json_response({"version": world.chatwoot_version, "timestamp": str(int(world.now()))})


_OPS[server_version] = "server_version"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api", server_version)
    base = "/api/v1/accounts/{account}"
    conv = base + "/conversations/{conversation:\\d+}"
    app.router.add_get(base + "/conversations", list_conversations)
    app.router.add_get(base + "/conversations/meta", conversations_meta)
    app.router.add_get(conv, get_conversation)
    app.router.add_post(conv + "/toggle_status", toggle_status)
    app.router.add_post(conv + "/assignments", assign)
    app.router.add_get(conv + "/labels", get_labels)
    app.router.add_post(conv + "/labels", set_labels)
    app.router.add_get(conv + "/messages", list_messages)
    app.router.add_post(conv + "/messages", create_message)
    app.router.add_get(base + "/inboxes/{inbox}/agent_bot", get_inbox_bot)
    app.router.add_get(base + "/canned_responses", list_canned)
    app.router.add_get(base + "/agents", list_agents)
