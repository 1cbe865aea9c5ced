"""The Chatwoot the router needs (issue 30): the minimum version, why, and how a reported version compares.

The router depends on behaviour that arrived in Chatwoot only recently (`docs/chatwoot.md` §8):

- signed agent-bot webhooks (#13892, v4.13.0): before, every webhook is refused (401) and Chatwoot opens every
  pending conversation;
- `account` in conversation webhooks (#12445) and the bot token's `show` and labels rights (#14655), v4.14.2:
  before, every `conversation_*` event is ignored and labels fail (401, then a handoff);
- the inbox bot as owner of a new conversation in a bot inbox (#14875, v4.16): before, ending (b) never fires
  and every confident owner becomes a pool handoff;
- assigning a person opens a pending bot-owned conversation (#14870, v4.17.0);
- `content_attributes.activity` on status activities (#14433, after v4.15.1): before, every reopened or
  second-turn conversation fails "activity pending" three times and is handed to people.

The first release with all of them is v4.17.0 (the contracts of the spec are v4.17–v4.18). Below it the worker
routes nothing: an operator gets no silent degradation, either the check passes or nothing is touched.
"""

from __future__ import annotations

import re

MIN_CHATWOOT_VERSION = (4, 17, 0)
MIN_CHATWOOT = ".".join(map(str, MIN_CHATWOOT_VERSION))

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """"4.17.2", "v4.18.0", "4.17.0-rc1" -> (major, minor, patch); None when it is not a version."""
    match = _VERSION.match(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def version_problem(reported: str | None) -> str | None:
    """Why a Chatwoot that reports `reported` (None: it could not be learned) must not be routed; None when it
    may."""
    if reported is None:
        return "its version is unknown"
    version = parse_version(reported)
    if version is None:
        return f"its version {reported[:40]!r} is not a version number"
    if version < MIN_CHATWOOT_VERSION:
        return f"version {reported[:40]} is older than {MIN_CHATWOOT}, the first with every behaviour the router needs"
    return None
