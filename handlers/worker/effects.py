"""The effect executor: one `EffectCommand` in, one `EffectOutcome` out (DESIGN §6).

The fold never does I/O; it emits commands and reads their outcomes as events. This module is the only place
that turns a command into Chatwoot or System One requests, so it owns three promises the fold relies on:

- it never raises for a Chatwoot or System One failure: every failure becomes an `EffectError` class
  (`missing` = JSON 404, `failed` with the status or None, `timeout`, `unconfirmed` for a reply whose
  creation cannot be confirmed, behavior.md §9.7 step e);
- `requests` is exactly the number of HTTP requests the command made (each one budget unit, §4.6);
- nothing private leaves it: contact names and e-mail addresses are used to redact turn text and then dropped,
  only the e-mail *domain* is reported (DESIGN §4), and error reasons never carry a body or a token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import httpx

from handlers.clients.chatwoot import (
    TIMEOUT_S,
    ChatwootClient,
    ChatwootError,
    ChatwootForeignBot,
    ChatwootInvalidResponse,
    ChatwootThrottled,
    ChatwootTimeout,
    ConversationMissing,
)
from handlers.clients.http_client import new_http_client
from handlers.clients.systemone import JevHTTPError, JevTimeout, SystemOneClient
from handlers.privacy.envelope import CannotOpen
from handlers.privacy.kek import UnknownKek
from handlers.privacy.keyring import Forgotten, KeyRing
from handlers.privacy.sealing import open_input, seal_conversation, seal_turn
from projections.jev import JevError, build_request
from projections.jobs import command_deadline
from projections.redaction import email_domain
from projections.turn import ReplyHistoryScan, TurnPager, message_view
from projections.worker.read_reuse import ReadReuse
from schemas.chatwoot import Conversation, Message
from schemas.config import RouterConfig, Settings
from schemas.keys import ConversationKey, SweepKey, parse_key
from schemas.records import (
    MUTATIONS,
    AgentsResult,
    Assign,
    CannedResult,
    ConversationResult,
    ConversationsPageResult,
    ConversationView,
    CreateMessage,
    CreateMessageResult,
    Decide,
    DecideResult,
    DoneResult,
    EffectCommand,
    EffectError,
    EffectOutcome,
    GetConversation,
    GetInboxBot,
    InboxBotResult,
    ListAgents,
    ListCanned,
    ListConversations,
    MessageView,
    OutcomeResult,
    ReadTurn,
    ReplyHistoryResult,
    ScanReplyHistory,
    SetLabels,
    SweepRow,
    ToggleStatus,
    Unassign,
)

log = logging.getLogger(__name__)

DECIDE_MEMO_SIZE = 1024
DEFAULT_FRESH_READ_MS = 5000  # ROUTER_FRESH_READ_MS
DEFAULT_SETTINGS_REUSE_MS = 5000  # ROUTER_SETTINGS_REUSE_MS
THROTTLE_MARGIN_MS = 5_000


class _BadCommand(Exception):
    """A command the executor cannot carry out as given (e.g. a route op on a sweep key)."""


class _ChangedSinceRead(Exception):
    """The conversation changed after the fresh read a mutation depends on: the mutation is not made."""


class _ReadBeforeFailed(Exception):
    """The read right before a mutation failed: the mutation was not made."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _MalformedPage(Exception):
    """A message page that could not be read as messages (behavior.md §10.2: the whole page fails)."""

    def __init__(self, status: int | None = None) -> None:
        super().__init__("a message page could not be read")
        self.status = status


def _contact_id(read: Conversation) -> int | None:
    """The conversation's contact, an id only: what `forget --contact` finds its conversations by."""
    return read.meta.sender.id if read.meta.sender is not None else None


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def conversation_view(conversation: Conversation) -> ConversationView:
    """What the rules read of a conversation; the contact is reduced to its e-mail domain (DESIGN §4)."""
    meta = conversation.meta
    contact = meta.sender
    return ConversationView(
        inbox_id=conversation.inbox_id,
        status=conversation.status,
        labels=tuple(conversation.labels),
        assignee_type=meta.assignee_type,
        assignee_id=meta.assignee.id if meta.assignee is not None else None,
        has_assignee=meta.has_assignee,
        blocked=bool(contact is not None and contact.blocked),
        email_domain=email_domain(contact.email if contact is not None else None),
        updated_at=conversation.updated_at,
    )


async def _page(chatwoot: ChatwootClient, account: int, conversation: int, before: int | None) -> list[Message]:
    """One message page; a page Chatwoot answered but that cannot be read is a malformed page (Decisions 9)."""
    try:
        return (await chatwoot.list_messages(account, conversation, before)).payload
    except ChatwootForeignBot:
        raise
    except ChatwootInvalidResponse as exc:
        raise _MalformedPage(exc.status) from None


def _views(page: list[Message], name: str | None, email: str | None) -> list[MessageView]:
    """A page as views, incoming text redacted with the contact's identities."""
    return [message_view(message, name=name, email=email) for message in page]


def classify(exc: Exception) -> EffectError:
    """The error class of a failed call; `reason` is the exception's own safe text (operation and status)."""
    if isinstance(exc, ConversationMissing):
        return EffectError(kind="missing", status=404, reason=str(exc))
    if isinstance(exc, ChatwootTimeout | JevTimeout):
        return EffectError(kind="timeout", reason=str(exc))
    if isinstance(exc, ChatwootForeignBot):
        return EffectError(kind="failed", status=exc.status, reason=str(exc), code="foreign_bot")
    if isinstance(exc, ChatwootError):
        return EffectError(kind="failed", status=exc.status, reason=str(exc))
    if isinstance(exc, JevHTTPError):
        return EffectError(kind="failed", status=exc.status, reason=str(exc))
    if isinstance(exc, JevError):
        return EffectError(kind="failed", reason=str(exc))
    if isinstance(exc, _MalformedPage):
        return EffectError(
            kind="failed", status=exc.status, reason="a message page could not be read", code="malformed_page"
        )
    if isinstance(exc, _BadCommand):
        return EffectError(kind="failed", reason=str(exc))
    if isinstance(exc, Forgotten):  # erased by `forget`: for the router the conversation is gone (issue 32)
        return EffectError(kind="missing", reason="forgotten")
    if isinstance(exc, UnknownKek):
        return EffectError(kind="failed", reason=f"data key wrapped by key-encryption key {exc.kek_id}, not given")
    if isinstance(exc, CannotOpen):
        return EffectError(kind="failed", reason="a sealed field does not open under its conversation's key")
    # Anything else is a bug here; its text might quote data, so only its type is reported.
    return EffectError(kind="failed", reason=f"internal error: {type(exc).__name__}")


class EffectExecutor:
    """Carries out effect commands against Chatwoot and System One.

    Clients may be injected (tests, shared pools); otherwise both share one `httpx.AsyncClient` over aiohttp
    (handlers/clients/http_client.py) that never follows redirects. `timeout_s` is the per-request limit (60 s in
    production; tests shorten it). `now_ms` stamps outcomes and is read for nothing else. Reads it may serve again
    are kept in `reuse` (projections/worker/read_reuse.py): within `fresh_read_ms` for a conversation read, within
    `settings_reuse_ms` (never longer) for an inbox's bot link and an account's agents.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        chatwoot: ChatwootClient | None = None,
        systemone: SystemOneClient | None = None,
        http: httpx.AsyncClient | None = None,
        keyring: KeyRing,
        now_ms: Callable[[], int] = _wall_clock_ms,
        timeout_s: float = TIMEOUT_S,
        decide_memo_size: int = DECIDE_MEMO_SIZE,
        fresh_read_ms: int = DEFAULT_FRESH_READ_MS,
        settings_reuse_ms: int = DEFAULT_SETTINGS_REUSE_MS,
    ) -> None:
        self._config = settings.config
        self.reuse = ReadReuse(fresh_read_ms, settings_reuse_ms, time.monotonic)
        self._keyring = keyring
        self._now_ms = now_ms
        self._owned_http: httpx.AsyncClient | None = None
        if http is None and (chatwoot is None or systemone is None):
            http = self._owned_http = new_http_client()
        secrets = settings.secrets
        self._chatwoot = chatwoot or ChatwootClient(
            self._config.chatwoot.api_base,
            secrets.chatwoot_token,
            secrets.agent_bot_tokens,
            http=http,
            timeout_s=timeout_s,
        )
        self._systemone = systemone or SystemOneClient(
            self._config.routing.endpoint, secrets.typesafe_api_key, http=http, timeout_s=timeout_s
        )
        self._memo_size = decide_memo_size
        self._request_timeout_s = timeout_s
        self._decided: OrderedDict[str, EffectOutcome] = OrderedDict()
        self._deciding: dict[str, asyncio.Future[EffectOutcome]] = {}

    def forget(self, key: str) -> None:
        """The conversation was erased (`forget`): no read of it is kept for reuse."""
        self.reuse.forget(key)

    async def aclose(self) -> None:
        """Close the HTTP connections this executor opened (injected clients are the caller's to close)."""
        if self._owned_http is not None:
            await self._owned_http.aclose()

    async def __aenter__(self) -> EffectExecutor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def execute(
        self, command: EffectCommand, config: RouterConfig | None = None, *, unchanged_since: float | None = None
    ) -> EffectOutcome:
        """Run one command; failures come back as `outcome.error`, never as exceptions.

        `config` is the configuration version in force for the command's partition (DESIGN §8); it decides the
        System One question. Endpoints and secrets stay those the executor was started with. With
        `unchanged_since` (Chatwoot's `updated_at` as the mutation's fresh read saw it), a mutation reads the
        conversation once more right before it is made, milliseconds apart as the reference does, and is not made
        when the conversation changed since: the outcome is then `stale_read` (DESIGN §6), and the read counts
        as one more request.
        """
        if isinstance(command.params, Decide):
            return await self._decide_once(command, config or self._config)
        return await self._run(command, config or self._config, unchanged_since)

    # --- the decide memo -----------------------------------------------------------------------------------

    async def _decide_once(self, command: EffectCommand, config: RouterConfig) -> EffectOutcome:
        """A re-issued decide (same command id) gets the remembered outcome: System One is asked once.

        The remembered outcome keeps its `requests` (the fold charges the call once, whichever copy it
        accepts) and is re-stamped with the current time so event time never goes backwards.
        """
        key = command.command_id
        while True:
            remembered = self._decided.get(key)
            if remembered is not None:
                self._decided.move_to_end(key)
                return remembered.model_copy(update={"at_ms": self._now_ms()})
            running = self._deciding.get(key)
            if running is None:
                break
            try:
                # shield: a cancelled duplicate must not cancel the call the first caller is awaiting
                await asyncio.shield(running)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not running.cancelled() or (me is not None and me.cancelling()):
                    raise  # our own cancel, even when it meets the first caller's
                # the first caller was cancelled: look again, and ask ourselves if nobody remembers
        future: asyncio.Future[EffectOutcome] = asyncio.get_running_loop().create_future()
        self._deciding[key] = future
        try:
            outcome = await self._run(command, config)
        except BaseException:
            future.cancel()
            raise
        finally:
            del self._deciding[key]
        self._decided[key] = outcome
        while len(self._decided) > self._memo_size:
            self._decided.popitem(last=False)
        future.set_result(outcome)
        return outcome

    # --- dispatch ------------------------------------------------------------------------------------------

    async def _run(
        self, command: EffectCommand, config: RouterConfig, unchanged_since: float | None = None
    ) -> EffectOutcome:
        chatwoot = self._chatwoot.metered(command.key)  # counts this command's requests only, waits in its turn
        counter = _JevCount()
        result: OutcomeResult | None = None
        error: EffectError | None = None
        check = unchanged_since is not None and command.op in MUTATIONS
        try:
            while True:
                try:
                    result = await self._mutate_or_read(command, chatwoot, counter, config, check, unchanged_since)
                    break
                except ChatwootThrottled:
                    # refused by the rate limit, so not made: again after the pause, from the read before it
                    if not self._time_to_retry(command, chatwoot.budget().paused_for_s):
                        raise
                    await chatwoot.until_unpaused()
                    # the attempt made again is charged, not the one the rate limit refused (throttling alone
                    # must never exhaust a run's budget of §4.6 and hand it off)
                    chatwoot.requests = 0
            made = chatwoot.requests + counter.requests
            if made > command.params.max_requests:  # the fold budgeted and timed the command by its bound
                raise _OverBudget(f"{command.op} made {made} requests, declares at most {command.params.max_requests}")
        except ChatwootThrottled:
            # throttled until its deadline was near: not made, and the run reads again (never a failure, §4.5)
            error = EffectError(kind="throttled", reason="throttled by Chatwoot's rate limit")
        except _ChangedSinceRead:
            error = EffectError(kind="stale_read", reason="changed since the fresh read")
        except _ReadBeforeFailed as exc:
            error = classify(exc.cause)
            if isinstance(command.params, CreateMessage):  # not sent, and never sent later (§9.7)
                error = error.model_copy(update={"kind": "stale_read", "status": None})
        except Exception as exc:
            error = classify(exc)
            if error.reason is not None and error.reason.startswith("internal error"):
                log.error(
                    "effect failed unexpectedly",
                    extra={"command_id": command.command_id, "op": command.op, "error_type": type(exc).__name__},
                )
            if isinstance(command.params, CreateMessage):
                error = self._unconfirmed(command, exc, error)
        return EffectOutcome(
            at_ms=self._now_ms(),
            key=command.key,
            account_id=command.account_id,
            command_id=command.command_id,
            op=command.op,
            result=result,
            error=error,
            requests=chatwoot.requests + counter.requests,
            rate_wait_ms=int(chatwoot.rate_wait_s * 1000),
        )

    async def _mutate_or_read(
        self,
        command: EffectCommand,
        chatwoot: ChatwootClient,
        counter: _JevCount,
        config: RouterConfig,
        check: bool,
        unchanged_since: float | None,
    ) -> OutcomeResult:
        if command.op in MUTATIONS:
            self.reuse.mutated(command.key)  # made or not, a read from before it is not lent any more
        if check and unchanged_since is not None:
            await chatwoot.reserve(2)  # the read and the mutation right after it: the budget never between them
            await self._unchanged_since(command, chatwoot, unchanged_since)
        return await self._dispatch(command, chatwoot, counter, config)

    def _time_to_retry(self, command: EffectCommand, pause_s: float) -> bool:
        """Whether a throttled mutation can wait out the pause and still be answered before the run's deadline for
        it (after which the fold would take it as lost): the pause plus a full request timeout, with a margin."""
        deadline = command_deadline(command.at_ms, command.params.max_requests)
        return self._now_ms() + (pause_s + self._request_timeout_s) * 1000 + THROTTLE_MARGIN_MS < deadline

    @staticmethod
    async def _unchanged_since(command: EffectCommand, chatwoot: ChatwootClient, since: float) -> None:
        """Raise unless the conversation is as its fresh read saw it (Chatwoot's `updated_at` not newer)."""
        account, conversation = _conversation_of(command)
        try:
            read = await chatwoot.get_conversation(account, conversation)
        except Exception as exc:
            raise _ReadBeforeFailed(exc) from None
        if read.updated_at is not None and read.updated_at > since:
            raise _ChangedSinceRead

    @staticmethod
    def _unconfirmed(command: EffectCommand, exc: Exception, error: EffectError) -> EffectError:
        """§9.7 step e: whatever went wrong, the reply may exist; the fold hands off and never resends."""
        key = _parsed_key(command.key)
        log.warning(
            "reply creation unconfirmed; handing off",
            extra={
                "account_id": command.account_id,
                "conversation_id": key.conversation_id if isinstance(key, ConversationKey) else None,
                "command_id": command.command_id,
                "error_type": type(exc).__name__,
                "error": error.reason,
            },
        )
        return error.model_copy(update={"kind": "unconfirmed"})

    async def _dispatch(
        self, command: EffectCommand, chatwoot: ChatwootClient, jev: _JevCount, config: RouterConfig
    ) -> OutcomeResult:
        p = command.params
        account = command.account_id
        if isinstance(p, ListConversations):
            page = await chatwoot.list_conversations(account, p.status, p.page)
            rows = tuple(
                SweepRow(
                    id=row.id,
                    assignee_type=row.meta.assignee_type,
                    assignee_id=row.meta.assignee.id if row.meta.assignee is not None else None,
                )
                for row in page.payload
            )
            return ConversationsPageResult(rows=rows)
        if isinstance(p, ListAgents):
            agents = self.reuse.agents(account)
            if agents is None:
                agents = AgentsResult(agent_ids=tuple(agent.id for agent in await chatwoot.list_agents(account)))
                self.reuse.read_agents(account, agents)
            return agents
        if isinstance(p, ListCanned):
            canned = await chatwoot.list_canned_responses(account)
            content = next((c.content for c in canned if c.short_code == p.short_code), None)
            return CannedResult(content=content)
        if isinstance(p, GetInboxBot):
            link = self.reuse.inbox_bot(account, p.inbox_id)
            if link is None:
                bot = await chatwoot.get_inbox_bot(account, p.inbox_id)
                link = InboxBotResult() if bot is None else InboxBotResult(bot_id=bot.id, bot_account_id=bot.account_id)
                self.reuse.read_inbox_bot(account, p.inbox_id, link)
            return link
        if isinstance(p, Decide):
            if not config.is_routed(account):
                raise _BadCommand(f"account {account} is not routed")
            body = build_request(config, account, open_input(p, self._keyring.known(command.key)))
            jev.requests += 1  # SystemOneClient.post counts first thing, so every decide call is one request
            decision = await self._systemone.decide(body, config.routing.min_confidence)
            return DecideResult(decision=decision)
        return await self._conversation_op(command, chatwoot)

    async def _conversation_op(self, command: EffectCommand, chatwoot: ChatwootClient) -> OutcomeResult:
        p = command.params
        account, conversation = _conversation_of(command)
        if isinstance(p, GetConversation):
            read = await chatwoot.get_conversation(account, conversation)
            self.reuse.read_conversation(command.key, read)
            key = await self._keyring.key_for(command.key, _contact_id(read))
            return ConversationResult(conversation=seal_conversation(conversation_view(read), key))
        if isinstance(p, ReadTurn):
            return await self._read_turn(chatwoot, command.key, account, conversation)
        if isinstance(p, ScanReplyHistory):
            scan = ReplyHistoryScan(p.bot_id)
            while (request := scan.next_request()) is not None:
                scan.feed(_views(await _page(chatwoot, account, conversation, request.before), None, None))
            return ReplyHistoryResult(found=scan.result())
        if isinstance(p, SetLabels):
            await chatwoot.set_labels(account, conversation, list(p.labels))
            return DoneResult(op="set_labels")
        if isinstance(p, ToggleStatus):
            await chatwoot.toggle_status(account, conversation, p.status)
            return DoneResult(op="toggle_status")
        if isinstance(p, Assign):
            await chatwoot.assign(account, conversation, p.assignee_id)
            return DoneResult(op="assign")
        if isinstance(p, Unassign):
            await chatwoot.unassign(account, conversation)
            return DoneResult(op="unassign")
        if isinstance(p, CreateMessage):
            receipt = await chatwoot.create_message(account, conversation, p.content)
            if receipt is None:
                return CreateMessageResult()
            try:
                (view,) = _views([receipt], None, None)
            except _MalformedPage:
                return CreateMessageResult()
            return CreateMessageResult(message=view)
        raise _BadCommand(f"unsupported op {command.op}")

    async def _read_turn(self, chatwoot: ChatwootClient, key: str, account: int, conversation: int) -> OutcomeResult:
        """§6.1: the contact's identities come from a conversation read and never leave this function; the texts
        leave it sealed under the conversation's data key (issue 32). The conversation read is the one the fresh
        read made just before when it is lent, and the pages are not read again when that read shows the
        conversation unchanged since they were (projections/worker/read_reuse.py)."""
        read = self.reuse.lend_conversation(key) or await chatwoot.get_conversation(account, conversation)
        turn = self.reuse.turn(key, read)
        if turn is None:
            contact = read.meta.sender
            name = contact.name if contact is not None else None
            email = contact.email if contact is not None else None
            pager = TurnPager()
            while (request := pager.next_request()) is not None:
                pager.feed(_views(await _page(chatwoot, account, conversation, request.before), name, email))
            turn = pager.result()
            self.reuse.read_turn(key, read, turn)
        if not any(m.text is not None for m in turn.messages):
            return turn
        return seal_turn(turn, await self._keyring.key_for(key, _contact_id(read)))


class _OverBudget(RuntimeError):
    """A command made more requests than its definition declares: a bug, reported as an internal error."""


class _JevCount:
    """System One requests made by one command (the shared client's counter spans all lanes)."""

    def __init__(self) -> None:
        self.requests = 0


def _parsed_key(key: str) -> ConversationKey | SweepKey | None:
    try:
        return parse_key(key)
    except ValueError:
        return None


def _conversation_of(command: EffectCommand) -> tuple[int, int]:
    """The account and conversation a route command acts on, from its "acct:conv" key."""
    key = _parsed_key(command.key)
    if not isinstance(key, ConversationKey) or key.account_id != command.account_id:
        raise _BadCommand(f"{command.op} needs a conversation key")
    return key.account_id, key.conversation_id
