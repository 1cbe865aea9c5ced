"""`chatwoot-router demo`: the whole router on one machine, in one command.

It starts, as supervised child processes, a local Kafka broker (unless KAFKA_BOOTSTRAP_SERVERS is set), the
sandbox (a simulated Chatwoot and System One), the ingress and one worker, with the bundled example configuration
(streams/demo/). It then plays the bundled conversations through the sandbox as Chatwoot would, shows progress,
and ends with a readable report. `--keep-running` leaves everything up and prints the URLs to poke at; Ctrl-C
stops every child cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from handlers.demo.report import render
from handlers.demo.run import (
    DemoPlayer,
    LogWatcher,
    check_expectation,
    conversation_report,
    load_bundled,
    main_outcome,
)
from handlers.kafka.security import brokers_answer
from handlers.privacy.kek import KEK_VAR, load_keks, new_kek_value
from handlers.privacy.reader_keys import KeysFollower
from handlers.processes import ChildFailed, Supervisor
from projections.logs.timeline import describe_outcome
from schemas.config import ConfigError, parse_config, read_env
from streams.kafka.local import KafkaLaunchError, ensure_jars, port_in_use

RETRY_BASE_MS = 500
SWEEP_INTERVAL_S = 20


class DemoError(RuntimeError):
    """A problem the user can fix; the message says how."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-running", action="store_true", help="leave everything running after the report")
    parser.add_argument("--only", action="append", metavar="ID", help="play only these conversations (repeatable)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--work-dir", type=Path, help="where logs and state go (default: a new temporary directory)")
    parser.add_argument("--kafka-port", type=int, default=19092, help="local broker port (default 19092)")
    parser.add_argument("--sandbox-port", type=int, default=3000, help="sandbox port (default 3000)")
    parser.add_argument("--ingress-port", type=int, default=8080, help="ingress port (default 8080)")
    parser.add_argument("--worker-port", type=int, default=6066, help="worker web port (default 6066)")
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="the sandbox as rough as the real Chatwoot: its rate limit, webhooks concurrent, reordered, duplicated",
    )


def _check_ports(args: argparse.Namespace, external_kafka: bool) -> None:
    wanted = {"--sandbox-port": args.sandbox_port, "--ingress-port": args.ingress_port}
    wanted["--worker-port"] = args.worker_port
    if not external_kafka:
        wanted["--kafka-port"] = args.kafka_port
    for option, port in wanted.items():
        if port_in_use(port):
            raise DemoError(
                f"port {port} is already in use on 127.0.0.1: stop what uses it, or pick another with {option} PORT"
            )


def _prepare_config(work: Path, sandbox_url: str) -> tuple[Path, Path, dict[str, str]]:
    """Write the configuration (pointed at the sandbox) and the scenario; return them and the secrets."""
    document = load_bundled("router.yaml")
    document["chatwoot"]["baseUrl"] = sandbox_url
    document["routing"]["endpoint"] = f"{sandbox_url}/v1/systemone"
    try:
        parse_config(document)
    except ConfigError as exc:  # the bundled file is part of the product; say so clearly if it breaks
        raise DemoError(f"the bundled demo configuration is invalid: {exc}") from None
    config_path = work / "router.yaml"
    config_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    scenario = load_bundled("scenario.yaml")
    scenario_path = work / "scenario.yaml"
    scenario_path.write_text(yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
    user_token = next(u["token"] for u in scenario["accounts"][0]["users"] if "token" in u)
    bots = {str(account["id"]): account["bots"][0] for account in scenario["accounts"]}
    secrets = {
        "CHATWOOT_TOKEN": user_token,
        "CHATWOOT_AGENT_BOT_TOKENS": json.dumps({a: bot["access_token"] for a, bot in bots.items()}),
        "CHATWOOT_AGENT_BOT_SECRETS": json.dumps({a: bot["secret"] for a, bot in bots.items()}),
        "TYPESAFE_API_KEY": scenario["systemone"]["api_key"],
        # the demo makes its own key-encryption key, kept with its data so a second run opens what the first sealed
        KEK_FILE_VAR: str(_demo_kek(work)),
    }
    return config_path, scenario_path, secrets


KEK_FILE_VAR = f"{KEK_VAR}_FILE"


def _demo_kek(work: Path) -> Path:
    """The demo's key-encryption key file (made once, readable by its owner only)."""
    path = work / "key-encryption-key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(new_kek_value())
    return path


def _say(text: str) -> None:
    print(text, flush=True)


def _start_everything(args: argparse.Namespace, work: Path, supervisor: Supervisor) -> dict[str, Any]:
    # a cluster named by KAFKA_BOOTSTRAP_SERVERS, or by KAFKA_CLIENT_PROPERTIES (its bootstrap.servers, else
    # localhost:9092): a secured cluster is never the demo's own plaintext broker
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or (
        read_env().bootstrap if (os.environ.get("KAFKA_CLIENT_PROPERTIES") or "").strip() else None
    )
    _check_ports(args, external_kafka=bool(external))
    sandbox_url = f"http://127.0.0.1:{args.sandbox_port}"
    ingress_url = f"http://127.0.0.1:{args.ingress_port}"
    worker_url = f"http://127.0.0.1:{args.worker_port}"
    config_path, scenario_path, secrets = _prepare_config(work, sandbox_url)

    if external:
        bootstrap = external
        if not brokers_answer(bootstrap):  # with the client security of KAFKA_CLIENT_PROPERTIES, if any
            raise DemoError(
                f"Kafka at {bootstrap} (KAFKA_BOOTSTRAP_SERVERS) is not reachable: start it, e.g. "
                "`chatwoot-router kafka`, or unset KAFKA_BOOTSTRAP_SERVERS to let the demo start its own"
            )
        _say(f"using Kafka at {bootstrap}")
    else:
        if shutil.which("java") is None:
            raise DemoError(
                "Java was not found: the local Kafka broker needs Java 17+ (e.g. `apt-get install "
                "openjdk-17-jre-headless`), or set KAFKA_BOOTSTRAP_SERVERS to a running broker"
            )
        try:
            ensure_jars(quiet=False)
        except KafkaLaunchError as exc:
            raise DemoError(str(exc)) from None
        _say("starting Kafka …")
        kafka = supervisor.start("kafka", ["kafka", "--port", str(args.kafka_port), "--data-dir", str(work / "kafka")])
        bootstrap = kafka.wait_for_line(r"ready bootstrap=(\S+)", 180).group(1)
    app_id = f"demo-{uuid.uuid4().hex[:8]}"
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "ROUTER_CONFIG": str(config_path),
        "ROUTER_APP_ID": app_id,
        "ROUTER_PARTITIONS": "4",
        "ROUTER_DATA_DIR": str(work / "state"),
        "ROUTER_RETRY_BASE_MS": str(RETRY_BASE_MS),
        "ROUTER_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S),
        **secrets,
    }
    supervisor.env.update(env)
    _say("starting the sandbox (simulated Chatwoot and System One) …")
    sandbox = supervisor.start(
        "sandbox",
        [
            "sandbox",
            "--port",
            str(args.sandbox_port),
            "--scenario",
            str(scenario_path),
            "--webhook-url",
            f"{ingress_url}/chatwoot/agent-bot",
            "--retry-delay",
            "1",
            *(["--realistic", "--seed", "3"] if args.realistic else []),
        ],
    )
    sandbox.wait_for_line(r"ready url=", 30)
    _say("starting the ingress …")
    ingress = supervisor.start("ingress", ["ingress", "--port", str(args.ingress_port)])
    ingress.wait_for_line(r"ready url=", 60)
    _say("starting the worker …")
    worker = supervisor.start("worker", ["worker", "--web-port", str(args.worker_port)])
    worker.wait_for_http(f"{worker_url}/healthz", 180)
    return {
        "bootstrap": bootstrap,
        "app_id": app_id,
        "config": parse_config(load_bundled_config(config_path)),
        "sandbox_url": sandbox_url,
        "ingress_url": ingress_url,
        "worker_url": worker_url,
        "keks": load_keks({KEK_FILE_VAR: secrets[KEK_FILE_VAR]}),
    }


def load_bundled_config(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


async def _play(args: argparse.Namespace, started: dict[str, Any], supervisor: Supervisor) -> list[dict[str, Any]]:
    scripts = load_bundled("conversations.yaml")
    if args.only:
        unknown = set(args.only) - {s["id"] for s in scripts}
        if unknown:
            raise DemoError(f"no such demo conversation: {', '.join(sorted(unknown))}")
        scripts = [s for s in scripts if s["id"] in args.only]
    keys = KeysFollower(started["bootstrap"], started["app_id"], started["keks"])
    watcher = LogWatcher(
        started["bootstrap"], f"{started['app_id']}.conversations", started["config"], RETRY_BASE_MS, keys
    )
    await watcher.start()
    player = DemoPlayer(started["sandbox_url"], watcher)
    try:
        _say(f"playing {len(scripts)} conversations …")

        async def one(script: dict[str, Any]) -> Any:
            played = await player.play(script)
            main = main_outcome(watcher.trail(played.key).outcomes)
            outcome = describe_outcome(main) if main else "no outcome"
            mark = "✗" if played.error else "✓"
            _say(f"  {mark} {script.get('title', script['id'])}: {outcome} ({played.finished - played.started:.1f} s)")
            return played

        played_all = await asyncio.gather(*(one(s) for s in scripts))
        supervisor.check_all()
        state = await player.control("GET", "/state")
        live = {f"{c['account_id']}:{c['id']}": c for c in state["conversations"]}
        return [conversation_report(p, watcher.trail(p.key), live.get(p.key)) for p in played_all]
    finally:
        await player.aclose()
        await watcher.stop()


def _wait_for_ctrl_c(started: dict[str, Any], supervisor: Supervisor) -> None:
    _say("")
    _say("everything keeps running; Ctrl-C stops it all")
    _say(f"  sandbox control API  {started['sandbox_url']}/_sandbox/state")
    _say(f"  ingress              {started['ingress_url']}/chatwoot/agent-bot  (health: /healthz, metrics: /metrics)")
    _say(f"  worker               {started['worker_url']}/healthz  and  {started['worker_url']}/metrics")
    _say(f"  Kafka                {started['bootstrap']}  (topics prefixed {started['app_id']}.)")
    while True:
        supervisor.check_all()
        time.sleep(1)


def run(args: argparse.Namespace) -> int:
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="chatwoot-router-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(log_dir=work)
    began = time.monotonic()

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop the children exactly as Ctrl-C does

    signal.signal(signal.SIGTERM, terminated)
    try:
        started = _start_everything(args, work, supervisor)
        rows = asyncio.run(_play(args, started, supervisor))
        print(render(rows, time.monotonic() - began), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        _say(f"logs and state: {work}")
        if args.keep_running:
            _wait_for_ctrl_c(started, supervisor)
        return 0 if all(not check_expectation(row) for row in rows) else 1
    except (DemoError, ChildFailed) as exc:
        print(f"chatwoot-router demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _say("\nstopping …")
        return 130
    except httpx.HTTPError as exc:
        print(f"chatwoot-router demo: the sandbox did not answer as expected: {exc}", file=sys.stderr)
        return 2
    finally:
        # A second Ctrl-C must not interrupt the shutdown and leave children running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        supervisor.stop_all(on_stop=lambda name: _say(f"stopping {name}"))
