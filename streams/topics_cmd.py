"""`chatwoot-router topics [--fix]`: list the app's topics with their settings and what is wrong (DESIGN §4).

Every topic of ROUTER_APP_ID is shown with its partitions, its replication and the settings the router gives it
(projections/topic_settings.py), followed by one line per finding. `--fix` sets what can be set in place with
incremental alter configs (only the named settings change; nothing else a topic was given is reset) and then
checks again. The partition count and the replication factor are never changed: their findings say what to do
by hand. Exit status: 0 when nothing is wrong (or everything was fixed), 1 when something is wrong and not
fixed (or Kafka cannot be used), 2 on an invalid environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiokafka.errors import KafkaError

from handlers.kafka.retry import KafkaUnusable, print_waiting, retrying
from handlers.kafka.topics import TopicReport, fix_topics, inspect_topics
from projections.topic_settings import (
    Finding,
    app_topics,
    corrections,
    human_ms,
    min_insync_for,
    replication_for,
    shown_settings,
)
from schemas.config import RouterEnv
from streams.config_cmd import env_or_exit

EXIT_WRONG = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fix", action="store_true", help="set the settings that can be corrected in place (never the partitions)"
    )


def render(report: TopicReport, bootstrap: str) -> list[str]:
    """The listing: one line per topic with its settings, then its findings; missing topics say who creates them."""
    replication = replication_for(report.brokers)
    lines = [
        f"topics of {report.app_id} at {bootstrap}: {report.brokers} broker(s), so replication {replication} "
        f"and min.insync.replicas {min_insync_for(replication)}"
    ]
    by_topic: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_topic.setdefault(finding.topic, []).append(finding)
    for name, kind in app_topics(report.app_id).items():
        state = report.topics.get(name)
        if state is None:
            lines.append(f"{name}  missing (the first worker or `config apply` creates it)")
            continue
        settings = " ".join(
            f"{key}={human_ms(state.configs.get(key)) if key == 'retention.ms' else state.configs.get(key)}"
            for key in shown_settings(kind)
        )
        lines.append(f"{name}  partitions={state.partitions} replication={state.replication}  {settings}")
        lines.extend(finding_line(finding) for finding in by_topic.get(name, []))
    return lines


def finding_line(finding: Finding) -> str:
    label = "wrong" if finding.risk else "differs"
    return f"  {label}: {finding.setting}={finding.value}: {finding.why}; fix: {finding.fix}"


def summary(findings: list[Finding]) -> str:
    if not findings:
        return "nothing to fix"
    fixable = sum(1 for finding in findings if finding.fixable)
    advice = "; run `chatwoot-router topics --fix`" if fixable else ""
    return f"{len(findings)} setting(s) to fix, {fixable} of them in place{advice}"


async def list_and_fix(env: RouterEnv, fix: bool) -> int:
    """Print the listing; with `fix`, set what can be set and print what remains. Returns the exit status.

    Each Kafka step waits out transient broker states (handlers/kafka/retry.py), so the listing is printed once.
    """
    waiting = print_waiting("topics", env.bootstrap)

    async def inspect() -> TopicReport:
        return await retrying(
            lambda: inspect_topics(env.bootstrap, env.app_id, env.log_retention_ms),
            bootstrap=env.bootstrap,
            on_wait=waiting,
        )

    report = await inspect()
    for line in render(report, env.bootstrap):
        print(line)
    if not report.topics:
        print(f"no topic of {env.app_id} exists yet")
        return 0
    changes = corrections(report.findings)
    if not fix or not changes:
        print(summary(report.findings))
        return EXIT_WRONG if report.findings else 0
    refused = await retrying(lambda: fix_topics(env.bootstrap, changes), bootstrap=env.bootstrap, on_wait=waiting)
    for finding in report.findings:
        if finding.wanted is not None and finding.topic not in refused:
            print(f"fixed {finding.topic} {finding.setting}: {finding.value} -> {finding.wanted}")
    for topic, error in sorted(refused.items()):
        print(f"not fixed {topic}: {error}")
    after = await inspect()
    for finding in after.findings:
        print(f"still to fix: {finding.topic}{finding_line(finding)[1:]}")
    print(summary(after.findings))
    return EXIT_WRONG if after.findings else 0


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()  # exit 2 on a bad variable, like every command
    try:
        return asyncio.run(list_and_fix(env, args.fix))
    except KafkaUnusable as exc:
        print(f"chatwoot-router topics: {exc}", file=sys.stderr)
    except (KafkaError, OSError) as exc:
        print(f"chatwoot-router topics: kafka at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return EXIT_WRONG
