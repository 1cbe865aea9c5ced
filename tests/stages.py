"""Run the suite in stages, fastest feedback first (`make test`, and so CI): docs/testing.md.

    .venv/bin/python -m tests.stages [--only STAGE ...] [pytest options]

1. `unit` (`-x`: the first failure stops the run, nothing else is worth waiting for then);
2. `no broker`: integration tests with real HTTP and subprocesses but no Kafka;
3. `kafka`: integration tests on a real broker;
4. `e2e`: the sandbox, the ingress and the worker end to end;
5. `cluster`: a three-node cluster of its own.

One local broker serves stages 3 and 4 (`KAFKA_BOOTSTRAP_SERVERS` when set, else `streams.kafka.local`), started
only when one of them runs and stopped at the end, whatever happened. Each stage prints its slowest tests
(`--durations`), and the run ends with each stage's time and result. Exit status: 0 when every stage passed, else 1
(2 for a usage error).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    name: str
    markers: str
    needs_broker: bool
    stop_at_first_failure: bool = False


STAGES = (
    Stage("unit", "unit", needs_broker=False, stop_at_first_failure=True),
    Stage("no broker", "not unit and not kafka and not e2e and not cluster", needs_broker=False),
    Stage("kafka", "kafka and not e2e and not cluster", needs_broker=True),
    Stage("e2e", "e2e and not cluster", needs_broker=True),
    Stage("cluster", "cluster", needs_broker=False),
)


@contextlib.contextmanager
def shared_broker(wanted: bool) -> Iterator[dict[str, str]]:
    """The environment for the stages: with one broker for all of them when a stage needs it."""
    env = dict(os.environ)
    if not wanted or env.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield env
        return
    from streams.kafka.local import running_broker

    with tempfile.TemporaryDirectory(prefix="stages-kafka-") as data, running_broker(data_dir=Path(data)) as broker:
        print(f"stages: one Kafka broker for the stages that need one, at {broker.bootstrap}", flush=True)
        env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
        yield env


def run_stage(stage: Stage, env: dict[str, str], extra: list[str]) -> tuple[int, float]:
    args = [sys.executable, "-m", "pytest", "-q", "-m", stage.markers, "--durations=10", "--durations-min=1", *extra]
    if stage.stop_at_first_failure:
        args.append("-x")
    print(f"\n=== stage {stage.name}: pytest -m {stage.markers!r}", flush=True)
    started = time.monotonic()
    code = subprocess.call(args, cwd=ROOT, env=env)
    return (0 if code == 5 else code), time.monotonic() - started  # 5: no test in this stage (a filtered run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=[s.name for s in STAGES], help="run only these stages")
    args, extra = parser.parse_known_args(argv)
    chosen = [s for s in STAGES if not args.only or s.name in args.only]
    results: list[tuple[Stage, int, float]] = []
    with shared_broker(any(s.needs_broker for s in chosen)) as env:
        for stage in chosen:
            code, seconds = run_stage(stage, env, extra)
            results.append((stage, code, seconds))
            if code != 0 and stage.stop_at_first_failure:
                break
    print("\n=== stages")
    for stage, code, seconds in results:
        print(f"{stage.name:>10}  {seconds:7.1f} s  {'passed' if code == 0 else f'FAILED (pytest exit {code})'}")
    skipped = [s.name for s in chosen if s not in [r[0] for r in results]]
    if skipped:
        print(f"not run after the failure above: {', '.join(skipped)}")
    print(f"{'total':>10}  {sum(r[2] for r in results):7.1f} s", flush=True)
    return 0 if all(code == 0 for _, code, _ in results) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
