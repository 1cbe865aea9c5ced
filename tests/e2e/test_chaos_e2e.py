"""The kill-loop test, short variant (issue 15; the long one is documented in docs/chaos.md).

One ingress and two workers (same app id, 8 partitions) route 40 conversations over a minute — assignments,
canned reply then resolve, spam, handoffs, snoozed newsletters, second messages, people taking over pending
conversations and editing ended ones, Chatwoot faults — while a random worker (sometimes the ingress) is
SIGKILLed 10 times and restarted within 2 s. Then a settle, an operator sweep, and bench/chaos_verify.py's
independent checks: no duplicate reply, no stale mutation undoing a person's change, no acknowledged webhook
left unfolded, every conversation ended, `audit --verify` clean. `CHAOS_SEED` replays a seed's plan.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from bench.chaos import Options, run_chaos


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_kill_loop_loses_nothing_and_runs_nothing_stale(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))
    work = tmp_path / "chaos"
    options = Options(conversations=40, kills=10, seed=seed, workers=2, partitions=8, work_dir=work)
    result = run_chaos(options, kafka_bootstrap)
    (work / "report.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    assert result.verdict.passed, (
        f"{result.summary()}\n{result.verdict.report()}\n"
        f"report, evidence (re-check: python -m bench.chaos_verify FILE) and process logs in {work}"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_paused_past_its_session_writes_nothing_stale_when_it_wakes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 34: a worker frozen (SIGSTOP) for 20-40 s, longer than its 15 s session, loses its partitions to the
    other worker; when it wakes (SIGCONT) it is fenced: it stops without writing its cache or making a mutation
    and starts again. The same independent checks hold (no duplicate reply, no stale mutation, `audit --verify`
    clean: no state written back in time), and the frozen worker did fence itself."""
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))
    work = tmp_path / "chaos"
    options = Options(
        conversations=40, kills=2, pauses=2, seed=seed, workers=2, partitions=8, duration_s=90, work_dir=work
    )
    result = run_chaos(options, kafka_bootstrap)
    (work / "report.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    assert result.verdict.passed, (
        f"{result.summary()}\n{result.verdict.report()}\n"
        f"report, evidence (re-check: python -m bench.chaos_verify FILE) and process logs in {work}"
    )
    paused = [e for e in result.timeline if str(e.get("what", "")).startswith("resumed")]
    assert result.fail_stops >= len(paused), f"a worker woke from a pause without fencing itself: {result.summary()}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_paused_while_it_recovers_its_partitions_is_fenced_when_it_wakes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 40: a worker restarted and frozen while it still recovers the partitions it was given (its /healthz
    503) loses them to the other worker; when it wakes it must fence itself, as one frozen while it folds does. A
    fence armed only once the worker was ready missed that pause: the worker finished its recovery, armed a fresh
    clock, folded, and wrote its changelog over the new owner's (`stale_writes`) before a refused commit stopped it
    (seed 4003 of bench/chaos.py --pause-in-recovery: 19 stale writes, 1 fail-stop in 14 pauses)."""
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))
    work = tmp_path / "chaos"
    options = Options(
        conversations=40,
        kills=0,
        pauses=2,
        pause_in_recovery=True,
        seed=seed,
        workers=2,
        partitions=8,
        duration_s=90,
        work_dir=work,
    )
    result = run_chaos(options, kafka_bootstrap)
    (work / "report.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    assert result.verdict.passed, (
        f"{result.summary()}\n{result.verdict.report()}\n"
        f"report, evidence (re-check: python -m bench.chaos_verify FILE) and process logs in {work}"
    )
    paused = [e for e in result.timeline if str(e.get("what", "")).startswith("resumed")]
    assert paused, f"no worker was caught in its recovery and woke: {result.summary()}"
    assert result.fail_stops >= len(paused), f"a worker woke from a pause without fencing itself: {result.summary()}"
