"""The environment of a router subprocess: the caller's, minus its own ROUTER_/CHATWOOT_/TYPESAFE_ variables."""

from __future__ import annotations

import os
from pathlib import Path

ROUTER_PREFIXES = ("ROUTER_", "CHATWOOT_", "TYPESAFE_")
TEST_KEK = "dGVzdHMgbWFrZSB0aGVpciBvd24ga2V5IDMyIGJ5dGU="  # 32 bytes, base64: the tests' own key-encryption key
"""The key-encryption key every router process of the tests gets (issue 32: the tests make their own)."""


def outside_env() -> dict[str, str]:
    """This process's environment without any router variable, so a test sees only what it sets."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ROUTER_PREFIXES)}


def router_env(config: Path, bootstrap: str, app_id: str, **extra: str) -> dict[str, str]:
    """The environment of a router subprocess (ingress, worker) for routed account 3, free of the caller's own
    ROUTER_/CHATWOOT_/TYPESAFE_ variables; `extra` adds or overrides variables."""
    env = outside_env()
    env.update(
        ROUTER_CONFIG=str(config),
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        ROUTER_APP_ID=app_id,
        ROUTER_PARTITIONS="2",
        CHATWOOT_TOKEN="user-token",
        CHATWOOT_AGENT_BOT_TOKENS='{"3":"bot-token"}',
        CHATWOOT_AGENT_BOT_SECRETS='{"3":"whsec-three"}',
        TYPESAFE_API_KEY="tsk",
        ROUTER_KEY_ENCRYPTION_KEY=TEST_KEK,
    )
    env.update(extra)
    return env
