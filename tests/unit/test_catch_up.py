"""The catch-up gate of a new owner's mutations (handlers/worker/catch_up.py): a head it could not look up at assignment
holds the partition's mutations until a later lookup finds it and the fold passes it."""

from __future__ import annotations

import asyncio

from handlers.worker.catch_up import CatchUp


def test_a_partition_whose_head_is_unknown_is_behind_until_its_head_is_learned_and_passed() -> None:
    gate = CatchUp()
    gate.assign(frozenset({0, 1}), {0: 10}, {0: 10, 1: 4})
    assert gate.caught_up(0)
    assert not gate.caught_up(1)  # the lookup failed: a person's takeover may be on it, unfolded
    assert gate.unknown() == frozenset({1})
    gate.learn_heads({1: 7})
    assert gate.unknown() == frozenset() and not gate.caught_up(1) and gate.behind(1) == 3
    gate.advanced(1, 7)
    assert gate.caught_up(1)


def test_a_waiting_mutation_wakes_when_the_learned_head_is_already_folded() -> None:
    async def scenario() -> bool:
        gate = CatchUp()
        gate.assign(frozenset({2}), {}, {2: 5})
        waiting = asyncio.ensure_future(gate.wait(2, 5.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        gate.learn_heads({2: 5})  # nothing arrived while the lookup failed: the fold is at the head already
        return await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(scenario())


def test_heads_learned_for_a_partition_that_moved_away_are_ignored() -> None:
    gate = CatchUp()
    gate.assign(frozenset({3}), {}, {})
    gate.revoke()
    gate.learn_heads({3: 1})
    assert not gate.caught_up(3) and gate.unknown() == frozenset()


def test_an_unknown_head_does_not_wait_past_the_bound() -> None:
    gate = CatchUp()
    gate.assign(frozenset({0}), {}, {0: 0})
    assert asyncio.run(gate.wait(0, 0.05)) is False  # the mutation is then reported stale_read and read again
