"""The Chatwoot REST client: the calls of behavior.md §10.2, and nothing else.

Errors carry only the HTTP status and an operation name, never a body or a token, because they end up in logs
and on the event log. Redirects are never followed (a token must not travel to another host), and every
request is counted so the caller can charge it against the run's budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from handlers.clients.budget import RequestBudget, budget_for
from handlers.clients.http_client import new_http_client
from schemas.chatwoot import (
    Agent,
    CannedResponse,
    Conversation,
    ConversationPage,
    InboxBot,
    Message,
    MessagePage,
)

log = logging.getLogger(__name__)

TIMEOUT_S = 60.0
M = TypeVar("M", bound=BaseModel)


class ChatwootError(Exception):
    """A failed Chatwoot call: `status` is the HTTP status, or None when no response arrived."""

    def __init__(self, operation: str, status: int | None, message: str | None = None) -> None:
        self.operation = operation
        self.status = status
        super().__init__(message or f"Chatwoot {operation} failed with HTTP {status}")

    @property
    def missing(self) -> bool:
        """True when Chatwoot said the conversation (or other resource) does not exist."""
        return False


class ConversationMissing(ChatwootError):
    """A 404 with a JSON body: the resource is gone (behavior.md §10.3)."""

    def __init__(self, operation: str) -> None:
        super().__init__(operation, 404)

    @property
    def missing(self) -> bool:
        return True


class ChatwootNetworkError(ChatwootError):
    """No response: connection refused or reset, DNS failure, protocol error."""

    def __init__(self, operation: str) -> None:
        super().__init__(operation, None, f"Chatwoot {operation} failed: network error")


class ChatwootTimeout(ChatwootNetworkError):
    """No complete response within the 60-second limit, body included (behavior.md §4.6)."""

    def __init__(self, operation: str) -> None:
        ChatwootError.__init__(self, operation, None, f"Chatwoot {operation} timed out")


class ChatwootInvalidResponse(ChatwootError):
    """A 2xx whose body does not have the shape the rules rely on."""

    def __init__(self, operation: str, status: int, reason: str = "an invalid response") -> None:
        super().__init__(operation, status, f"Chatwoot {operation} returned {reason}")


class ChatwootThrottled(ChatwootError):
    """A mutation Chatwoot refused with 429 (its rate limit): it was not made, and may be made once the pause ends.

    Reads are never raised as this: they wait out the pause and are made again (a read twice is harmless)."""

    def __init__(self, operation: str) -> None:
        super().__init__(operation, 429, f"Chatwoot {operation} throttled (HTTP 429)")


class ChatwootForeignBot(ChatwootInvalidResponse):
    """The inbox is linked to a system bot or another account's bot: the router must not act (Decisions 9)."""

    def __init__(self, operation: str, status: int) -> None:
        super().__init__(operation, status, "a bot that does not belong to the account")


class ChatwootClient:
    """Calls Chatwoot for one installation; `requests` counts the HTTP requests this instance made that Chatwoot
    served (a 429 is not counted: the request was refused, and the run's budget of §4.6 is for answers).

    Use `metered()` for a view that shares the connection pool but counts on its own, so one executor lane
    can charge exactly its own requests to its run's budget. Every request first waits for the installation's
    request budget (handlers/clients/budget.py), in turn with the other conversations' requests.
    """

    def __init__(
        self,
        base_url: str,
        user_token: str,
        bot_tokens: Mapping[int, str],
        *,
        http: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = TIMEOUT_S,
        budget: RequestBudget | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._budget = budget
        self.lane = ""  # whose turn a waiting request takes in the budget's line (a conversation key)
        self._prepaid = 0.0
        self._user_token = user_token
        self._bot_tokens = dict(bot_tokens)
        self._http = http or new_http_client(transport)
        self._owns_http = http is None
        self._timeout_s = timeout_s
        self.requests = 0
        self.rate_wait_s = 0.0  # how long this instance's requests waited for the rate limit (budget or pause)

    def metered(self, lane: str = "") -> ChatwootClient:
        """A client sharing this one's connections, tokens and budget, with its own request counter at 0, waiting
        for the budget in `lane`'s turn."""
        view = object.__new__(ChatwootClient)
        view.__dict__.update(self.__dict__)
        view._owns_http = False
        view.requests = 0
        view.rate_wait_s = 0.0
        view.lane = lane
        view._prepaid = 0.0
        return view

    def budget(self) -> RequestBudget:
        """The installation's request budget (shared by every client of it in this event loop)."""
        if self._budget is None:
            self._budget = budget_for(self._base)
        return self._budget

    async def reserve(self, n: int) -> None:
        """Wait for `n` requests' tokens at once, for requests that must follow each other closely (a mutation
        right after the read it depends on): the budget does not come between them."""
        self.rate_wait_s += await self.budget().take(self.lane, n)
        self._prepaid += n

    async def until_unpaused(self) -> None:
        """Wait until a pause after a 429 has ended."""
        while (pause := self.budget().paused_for_s) > 0:
            await asyncio.sleep(pause)
            self.rate_wait_s += pause

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ChatwootClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- plumbing -----------------------------------------------------------------------------------------

    def _bot_token(self, account_id: int) -> str:
        token = self._bot_tokens.get(account_id)
        if token is None:
            raise ChatwootError("bot token lookup", None, f"no agent-bot token for account {account_id}")
        return token

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        token: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
    ) -> httpx.Response:
        """One request with the common rules of §10.1; returns a 2xx response with its body read.

        A 429 pauses the installation's budget; a read then waits and is made again, a mutation raises
        `ChatwootThrottled` (the caller decides whether its fresh read still holds)."""
        # `Api-Access-Token`, not `api_access_token`: Chatwoot reads both, and a default nginx in front of it drops
        # header names with underscores (chatwoot.md §8)
        headers = {"Api-Access-Token": token, "accept": "application/json"}
        budget = self.budget()
        while True:
            if self._prepaid >= 1:
                self._prepaid -= 1
            else:
                self.rate_wait_s += await budget.take(self.lane)
            try:
                async with asyncio.timeout(self._timeout_s):
                    response = await self._http.request(
                        method,
                        self._base + path,
                        params=params,
                        json=json,
                        headers=headers,
                        follow_redirects=False,
                        timeout=self._timeout_s,
                    )
            except (TimeoutError, httpx.TimeoutException):
                self.requests += 1
                raise ChatwootTimeout(operation) from None
            except httpx.HTTPError:
                self.requests += 1
                raise ChatwootNetworkError(operation) from None
            if response.status_code != 429:
                break
            pause = budget.throttled(response.headers.get("retry-after"))
            log.info("Chatwoot throttled a request", extra={"operation": operation, "pause_s": round(pause, 1)})
            if method != "GET":
                raise ChatwootThrottled(operation)
        self.requests += 1
        budget.answered()
        if 200 <= response.status_code < 300:
            return response
        if response.status_code == 404 and "application/json" in response.headers.get("content-type", ""):
            if method == "GET":
                log.info("Chatwoot resource deleted", extra={"operation": operation})
            raise ConversationMissing(operation)
        raise ChatwootError(operation, response.status_code)

    @staticmethod
    def _json(operation: str, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ChatwootInvalidResponse(operation, response.status_code, "a body that is not JSON") from None

    def _model(self, model: type[M], operation: str, response: httpx.Response) -> M:
        try:
            return model.model_validate(self._json(operation, response))
        except ValidationError:
            raise ChatwootInvalidResponse(operation, response.status_code) from None

    def _account(self, account_id: int) -> str:
        return f"/api/v1/accounts/{account_id}"

    def _conversation(self, account_id: int, conversation_id: int) -> str:
        return f"/api/v1/accounts/{account_id}/conversations/{conversation_id}"

    # --- the installation ---------------------------------------------------------------------------------

    async def server_version(self) -> str:
        """The version the installation reports on `GET /api` (no token): `{"version": "4.x.y", ...}`."""
        op = "get version"
        self.requests += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._http.get(
                    self._base + "/api", headers={"accept": "application/json"}, follow_redirects=False
                )
        except (TimeoutError, httpx.TimeoutException):
            raise ChatwootTimeout(op) from None
        except httpx.HTTPError:
            raise ChatwootNetworkError(op) from None
        if not 200 <= response.status_code < 300:
            raise ChatwootError(op, response.status_code)
        body = self._json(op, response)
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(version, str):
            raise ChatwootInvalidResponse(op, response.status_code, "no version")
        return version

    # --- reads (user token) -------------------------------------------------------------------------------

    async def get_conversation(self, account_id: int, conversation_id: int) -> Conversation:
        """The conversation's live state; raises ConversationMissing when it was deleted."""
        op = "get conversation"
        response = await self._call(op, "GET", self._conversation(account_id, conversation_id), self._user_token)
        return self._model(Conversation, op, response)

    async def list_messages(self, account_id: int, conversation_id: int, before: int | None = None) -> MessagePage:
        """Up to 20 messages (oldest first), those with id < `before` when given."""
        op = "list messages"
        path = self._conversation(account_id, conversation_id) + "/messages"
        params = {"before": before} if before is not None else None
        response = await self._call(op, "GET", path, self._user_token, params=params)
        return self._model(MessagePage, op, response)

    async def get_inbox_bot(self, account_id: int, inbox_id: int) -> InboxBot | None:
        """The inbox's account bot, or None when unlinked (or the inbox is gone).

        A system bot or another account's bot is an error: the router must not act for it (Decisions 9).
        """
        op = "get inbox agent bot"
        path = f"{self._account(account_id)}/inboxes/{inbox_id}/agent_bot"
        try:
            response = await self._call(op, "GET", path, self._user_token)
        except ConversationMissing:
            return None
        body = self._json(op, response)
        if not isinstance(body, dict):
            raise ChatwootInvalidResponse(op, response.status_code)
        raw = body.get("agent_bot")
        if raw is None or (isinstance(raw, dict) and raw.get("id") is None):
            return None
        try:
            bot = InboxBot.model_validate(raw)
        except ValidationError:
            raise ChatwootInvalidResponse(op, response.status_code) from None
        if bot.account_id != account_id:
            raise ChatwootForeignBot(op, response.status_code)
        return bot

    async def list_conversations(self, account_id: int, status: str, page: int) -> ConversationPage:
        """One page (25 rows) of the account's conversations with `status`, any assignee (sweep, §5)."""
        op = "list conversations"
        params: dict[str, str | int] = {"status": status, "assignee_type": "all", "page": page}
        try:
            response = await self._call(
                op, "GET", f"{self._account(account_id)}/conversations", self._user_token, params=params
            )
        except ConversationMissing:
            raise ChatwootError(op, 404) from None
        try:
            return ConversationPage.from_response(self._json(op, response))
        except ValidationError:
            raise ChatwootInvalidResponse(op, response.status_code) from None

    async def list_canned_responses(self, account_id: int) -> list[CannedResponse]:
        op = "list canned responses"
        return await self._list(op, f"{self._account(account_id)}/canned_responses", CannedResponse)

    async def list_agents(self, account_id: int) -> list[Agent]:
        op = "list agents"
        return await self._list(op, f"{self._account(account_id)}/agents", Agent)

    async def _list(self, op: str, path: str, model: type[M]) -> list[M]:
        try:
            response = await self._call(op, "GET", path, self._user_token)
        except ConversationMissing:
            raise ChatwootError(op, 404) from None
        try:
            return TypeAdapter(list[model]).validate_python(self._json(op, response))  # type: ignore[valid-type]
        except ValidationError:
            raise ChatwootInvalidResponse(op, response.status_code) from None

    # --- mutations (the account's bot token) --------------------------------------------------------------

    async def toggle_status(self, account_id: int, conversation_id: int, status: str) -> None:
        path = self._conversation(account_id, conversation_id) + "/toggle_status"
        await self._call("toggle status", "POST", path, self._bot_token(account_id), json={"status": status})

    async def assign(self, account_id: int, conversation_id: int, user_id: int) -> None:
        path = self._conversation(account_id, conversation_id) + "/assignments"
        body = {"assignee_id": user_id, "assignee_type": "User"}
        await self._call("assign", "POST", path, self._bot_token(account_id), json=body)

    async def unassign(self, account_id: int, conversation_id: int) -> None:
        path = self._conversation(account_id, conversation_id) + "/assignments"
        await self._call("unassign", "POST", path, self._bot_token(account_id), json={"assignee_id": None})

    async def set_labels(self, account_id: int, conversation_id: int, labels: list[str]) -> None:
        """Replaces the conversation's whole label list."""
        path = self._conversation(account_id, conversation_id) + "/labels"
        await self._call("set labels", "POST", path, self._bot_token(account_id), json={"labels": labels})

    async def create_message(self, account_id: int, conversation_id: int, content: str) -> Message | None:
        """Posts a public reply; returns the created message, or None when its 2xx body is unreadable.

        None means "sent, but no receipt": the caller must not assume it failed (behavior.md §9.7).
        """
        path = self._conversation(account_id, conversation_id) + "/messages"
        body = {"content": content, "message_type": "outgoing", "private": False}
        response = await self._call("create message", "POST", path, self._bot_token(account_id), json=body)
        try:
            return Message.model_validate(response.json())
        except (ValueError, ValidationError):
            return None
