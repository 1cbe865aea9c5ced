"""Scenarios: the accounts, users, bots, inboxes and canned responses a sandbox starts with.

A scenario is a JSON/YAML document:

    accounts:
      - id: 1
        name: Acme
        keep_pending_on_bot_failure: false
        users:   [{id: 1, name: Ada, email: ada@acme.test, role: administrator, token: user-token},
                  {id: 2, name: Bob, role: agent, inboxes: [7]}]   # agents: inbox memberships (default all)
        bots:    [{id: 5, name: Acme bot, access_token: bot-token, secret: bot-secret, outgoing_url: null}]
        inboxes: [{id: 7, name: Website, channel: Channel::WebWidget, bot_id: 5, bot_active: true,
                   automation_message: "Thanks, we got your message."}]   # optional: see below
        canned_responses: [{short_code: refund, content: "Refunds take 5 days."}]
    system_bots: [{id: 9, name: Platform bot, access_token: sys-token, secret: sys-secret}]
    systemone: {api_key: jev-key}
    settings: {realistic: true, rate_limit: 20}   # optional: as POST /_sandbox/settings (control.py)

An inbox's `automation_message` imitates an automation rule "send message" on new conversations: after a
conversation's first incoming message, an outgoing public message with no sender and
`content_attributes.automation_rule_id` (what `AutomationRules::ActionService#send_message` writes), so scripted
conversations meet the sender-less messages real accounts have (chatwoot.md §8).

A user listed under several accounts with the same id is one user, member of each. `from_config` derives a
scenario from the router's configuration, so `chatwoot-router sandbox --config` matches the router it serves.
"""

from __future__ import annotations

from typing import Any

from sandbox.model import Account, Bot, CannedResponse, Inbox, User
from sandbox.world import World
from schemas.config import RouterConfig

DEFAULT_USER_TOKEN = "sandbox-user-token"
DEFAULT_API_KEY = "sandbox-jev-key"


def bot_token(account_id: int) -> str:
    return f"sandbox-bot-token-{account_id}"


def bot_secret(account_id: int) -> str:
    return f"sandbox-bot-secret-{account_id}"


def load(world: World, scenario: dict[str, Any]) -> None:
    """Seed `world` (assumed empty) from a scenario document; raises KeyError/ValueError on a bad one."""
    for raw_account in scenario.get("accounts", []):
        account = Account(
            id=int(raw_account["id"]),
            name=str(raw_account.get("name", f"Account {raw_account['id']}")),
            keep_pending_on_bot_failure=bool(raw_account.get("keep_pending_on_bot_failure", False)),
        )
        world.accounts[account.id] = account
        for raw in raw_account.get("users", []):
            user = world.users.get(int(raw["id"])) or User(
                id=int(raw["id"]),
                name=str(raw["name"]),
                email=str(raw.get("email", f"user{raw['id']}@sandbox.test")),
                token=str(raw.get("token", f"sandbox-user-{raw['id']}")),
                availability_status=str(raw.get("availability_status", "online")),
                inbox_ids={int(i) for i in raw["inboxes"]} if "inboxes" in raw else None,
            )
            role = raw.get("role", "agent")
            if role not in ("administrator", "agent"):
                raise ValueError(f"user {user.id}: role must be administrator or agent")
            user.accounts[account.id] = role
            world.users[user.id] = user
        for raw in raw_account.get("bots", []):
            _add_bot(world, raw, account.id)
        for raw in raw_account.get("inboxes", []):
            inbox = Inbox(
                id=int(raw["id"]),
                account_id=account.id,
                name=str(raw.get("name", f"Inbox {raw['id']}")),
                channel=str(raw.get("channel", "Channel::WebWidget")),
                bot_id=raw.get("bot_id"),
                bot_active=bool(raw.get("bot_active", True)),
                automation_message=str(raw["automation_message"]) if raw.get("automation_message") else None,
            )
            world.inboxes[inbox.id] = inbox
        for raw in raw_account.get("canned_responses", []):
            canned_id = int(raw.get("id") or world.next_id("canned"))
            world.canned[canned_id] = CannedResponse(
                id=canned_id,
                account_id=account.id,
                short_code=str(raw["short_code"]),
                content=str(raw["content"]),
                created_at=world.now(),
            )
    for raw in scenario.get("system_bots", []):
        _add_bot(world, raw, None)
    for inbox in world.inboxes.values():
        if inbox.bot_id is not None and inbox.bot_id not in world.bots:
            raise ValueError(f"inbox {inbox.id}: unknown bot {inbox.bot_id}")


def _add_bot(world: World, raw: dict[str, Any], account_id: int | None) -> None:
    bot = Bot(
        id=int(raw["id"]),
        name=str(raw.get("name", f"Bot {raw['id']}")),
        account_id=account_id,
        access_token=str(raw.get("access_token", f"sandbox-bot-{raw['id']}")),
        secret=str(raw.get("secret", f"sandbox-secret-{raw['id']}")),
        outgoing_url=raw.get("outgoing_url"),
        description=str(raw.get("description", "")),
    )
    world.bots[bot.id] = bot


def from_config(
    config: RouterConfig,
    *,
    user_token: str = DEFAULT_USER_TOKEN,
    bot_tokens: dict[int, str] | None = None,
    bot_secrets: dict[int, str] | None = None,
    api_key: str = DEFAULT_API_KEY,
) -> dict[str, Any]:
    """A scenario matching a router configuration: per routed account its brand bot, a bot inbox, an
    administrator (the token owner), one agent per owner assignee and a canned response per short code."""
    accounts = []
    for account_id, owners in config.routing.accounts.items():
        bot_id = config.routing.bot_ids[account_id]
        users: list[dict[str, Any]] = [{"id": 1, "name": "Sandbox Admin", "role": "administrator", "token": user_token}]
        for name, owner in owners.items():
            if owner.assignee != 1:
                users.append({"id": owner.assignee, "name": f"{name.title()} Agent", "role": "agent"})
        canned = [
            {"short_code": kind.canned_response, "content": f"Thanks! Here is our {name} information."}
            for name, kind in (config.kinds_of(account_id) or {}).items()
            if kind.canned_response
        ]
        accounts.append(
            {
                "id": account_id,
                "name": f"Account {account_id}",
                "users": users,
                "bots": [
                    {
                        "id": bot_id,
                        "name": "Router bot",
                        "access_token": (bot_tokens or {}).get(account_id, bot_token(account_id)),
                        "secret": (bot_secrets or {}).get(account_id, bot_secret(account_id)),
                    }
                ],
                "inboxes": [{"id": account_id * 100 + 1, "name": "Website", "bot_id": bot_id}],
                "canned_responses": list({c["short_code"]: c for c in canned}.values()),
            }
        )
    return {"accounts": accounts, "systemone": {"api_key": api_key}}


# A small installation used by tests and as an example: account 1 with its router bot linked to the website
# inbox, a second inbox without a bot, one linked to a system bot and one to account 2's bot.
SAMPLE: dict[str, Any] = {
    "accounts": [
        {
            "id": 1,
            "name": "Acme",
            "users": [
                {
                    "id": 1,
                    "name": "Ada Admin",
                    "email": "ada@acme.test",
                    "role": "administrator",
                    "token": "user-1",
                },
                {
                    "id": 2,
                    "name": "Bob Billing",
                    "email": "bob@acme.test",
                    "role": "agent",
                    "token": "user-2",
                },
                {
                    "id": 3,
                    "name": "Cy Sales",
                    "email": "cy@acme.test",
                    "role": "agent",
                    "token": "user-3",
                    "inboxes": [8],
                },
            ],
            "bots": [{"id": 5, "name": "Acme Router", "access_token": "bot-5", "secret": "secret-5"}],
            "inboxes": [
                {"id": 7, "name": "Website", "bot_id": 5},
                {"id": 8, "name": "Email", "channel": "Channel::Email"},
                {"id": 9, "name": "Platform", "bot_id": 90},
                {"id": 10, "name": "Partner", "bot_id": 6},
            ],
            "canned_responses": [
                {"short_code": "refund", "content": "Refunds take five working days."},
                {"short_code": "hours", "content": "We are open 9 to 5."},
            ],
        },
        {
            "id": 2,
            "name": "Partner Co",
            "users": [{"id": 1, "name": "Ada Admin", "role": "administrator"}],
            "bots": [{"id": 6, "name": "Partner bot", "access_token": "bot-6", "secret": "secret-6"}],
            "inboxes": [{"id": 20, "name": "Partner site", "bot_id": 6}],
        },
    ],
    "system_bots": [{"id": 90, "name": "Platform bot", "access_token": "bot-90", "secret": "secret-90"}],
    "systemone": {"api_key": "jev-key"},
}
