"""One shared stack for the end-to-end tests (`tests/support/stack.py`), started once per session; each test
makes its own conversations.

The helpers live in `tests/support/`; the names below are re-exported so `from tests.e2e.conftest import …`
keeps working.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from streams.kafka.local import free_port
from tests.support.kafka import read_all
from tests.support.processes import ROOT, Process
from tests.support.stack import (
    API_KEY,
    BILLING,
    BOT_SECRETS,
    BOT_TOKENS,
    INBOX_1,
    INBOX_2,
    RETRY_BASE_MS,
    SALES,
    USER_TOKEN,
    Stack,
    bot_messages,
    router_config,
)
from tests.support.waiting import wait_until

__all__ = [
    "API_KEY",
    "BILLING",
    "BOT_SECRETS",
    "BOT_TOKENS",
    "INBOX_1",
    "INBOX_2",
    "RETRY_BASE_MS",
    "ROOT",
    "SALES",
    "USER_TOKEN",
    "Process",
    "Stack",
    "bot_messages",
    "free_port",
    "read_all",
    "router_config",
    "wait_until",
]


@pytest.fixture(scope="session")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    running = Stack(kafka_bootstrap, f"e2e-{os.getpid()}-{int(time.time())}", tmp)
    try:
        running.start()
        yield running
    finally:
        running.stop()


REALISTIC = ("--realistic", "--seed", "7")
"""The sandbox as rough as the real Chatwoot (issue 30): its rate limit, webhooks concurrent, reordered and
duplicated, `conversation_updated` on bot replies; a fixed seed so a failure can be replayed."""


@pytest.fixture(scope="session")
def realistic_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A second shared stack, its sandbox in realistic mode, for the tests that run in both modes."""
    tmp = tmp_path_factory.mktemp("e2e-realistic")
    running = Stack(kafka_bootstrap, f"e2e-real-{os.getpid()}-{int(time.time())}", tmp, sandbox_args=REALISTIC)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def e2e(stack: Stack) -> Iterator[Stack]:
    """The shared stack, with no fault rules left over from another test."""
    stack.clear_faults()
    yield stack
    stack.clear_faults()
