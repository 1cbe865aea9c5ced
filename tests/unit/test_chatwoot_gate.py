"""The Chatwoot the router needs (issue 30): the minimum version and the gate that holds every command while the
Chatwoot is older or its version unknown, then lets them run by itself once it is right."""

from __future__ import annotations

import asyncio

import pytest

from handlers.worker.chatwoot_gate import ChatwootGate
from projections.chatwoot_version import MIN_CHATWOOT, parse_version, version_problem
from tests.unit.test_fold_driver import FakeChatwoot, incoming
from tests.unit.test_worker_service import Bus, new_service, new_tables, run_until_quiet, webhook


def test_the_minimum_is_the_first_release_with_everything_the_router_needs() -> None:
    assert MIN_CHATWOOT == "4.17.0"  # #14870 in v4.17.0; #14875 (v4.16), #14433, #14655, #12445, #13892 before it
    assert version_problem("4.17.0") is None and version_problem("v4.18.1") is None
    assert version_problem("5.0.0") is None
    assert "older than 4.17.0" in (version_problem("4.15.1") or "")
    assert "older than 4.17.0" in (version_problem("4.16.9") or "")
    assert version_problem(None) == "its version is unknown"
    assert "not a version number" in (version_problem("<html>") or "")
    assert parse_version("4.17.0-rc1") == (4, 17, 0) and parse_version("4.17") == (4, 17, 0)


class Versions:
    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)

    async def __call__(self) -> str:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_an_old_chatwoot_closes_the_gate_with_one_line_and_an_upgrade_opens_it() -> None:
    changes: list[bool] = []
    gate = ChatwootGate("http://chatwoot", Versions("4.15.1", "4.17.2"), on_change=changes.append)
    assert not gate.is_open  # closed until the first check
    await gate.check()
    assert not gate.is_open and gate.reason is not None
    assert "version 4.15.1 is older than 4.17.0" in gate.reason and "\n" not in gate.reason
    await gate.check()
    assert gate.is_open and gate.reason is None and gate.version == "4.17.2"
    assert changes == [False, True]


async def test_an_unknown_version_keeps_the_gate_closed_unless_the_operator_states_it() -> None:
    gate = ChatwootGate("http://chatwoot", Versions(OSError("refused")))
    await gate.check()
    assert not gate.is_open and gate.reason is not None
    assert "unknown" in gate.reason and "GET /api failed: OSError" in gate.reason
    assert "ROUTER_CHATWOOT_VERSION" in gate.reason
    stated = ChatwootGate("http://chatwoot", Versions(OSError("a proxy without /api")), stated_version="4.18.0")
    await stated.check()
    assert stated.is_open and stated.version == "4.18.0"


async def test_a_recheck_without_an_answer_keeps_the_version_learned_and_an_answer_still_counts() -> None:
    changes: list[bool] = []
    versions = Versions("4.18.0", RuntimeError("429 Retry later"), "4.15.1")
    gate = ChatwootGate("http://chatwoot", versions, on_change=changes.append)
    await gate.check()
    assert gate.is_open and gate.version == "4.18.0"
    await gate.check()  # Chatwoot's rate limit refused GET /api: routing goes on, on the version it reported
    assert gate.is_open and gate.version == "4.18.0" and gate._unanswered
    await gate.check()  # an answer: an older Chatwoot closes the gate as ever
    assert not gate.is_open and "older than 4.17.0" in (gate.reason or "")
    assert changes == [True, False]
    unknown = ChatwootGate("http://chatwoot", Versions(RuntimeError("429 Retry later")))
    await unknown.check()  # never learned: no answer keeps it closed
    assert not unknown.is_open


async def test_commands_wait_while_the_gate_is_closed_and_run_once_it_opens() -> None:
    """Nothing is run against an old Chatwoot (no read, no mutation, no handoff: no failure counted), and the
    turn goes on where it stopped once the version is right."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    gate = ChatwootGate("http://chatwoot", Versions("4.15.1", "4.18.0"))
    await gate.check()
    service.gate = gate
    webhook(bus)
    routing = asyncio.ensure_future(run_until_quiet(service, bus))
    async with asyncio.timeout(5):
        while service.metrics.commands_held._value.get() < 1:
            await asyncio.sleep(0)
    assert chatwoot.ops() == []  # nothing reached Chatwoot
    assert not routing.done()
    await gate.check()
    async with asyncio.timeout(10):
        await routing
    assert chatwoot.ops()[-1] == "assign"


@pytest.mark.parametrize("value", ["4.17.2", "v4.18", "4.17"])
def test_the_stated_version_is_a_version(value: str) -> None:
    from schemas.config import read_env

    assert read_env({"ROUTER_CHATWOOT_VERSION": value}).chatwoot_version == value


def test_a_stated_version_that_is_not_one_names_the_variable() -> None:
    from schemas.config import ConfigError, read_env

    with pytest.raises(ConfigError, match="ROUTER_CHATWOOT_VERSION"):
        read_env({"ROUTER_CHATWOOT_VERSION": "latest"})
