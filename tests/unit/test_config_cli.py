"""Bad configuration and environment, as an operator meets them (issue 10 item 7): every command answers with
exit status 2 and exactly one line on stderr naming the key path or variable, never a traceback.

Each kind of case runs the real command in a subprocess (no broker needed: they all stop before touching
Kafka); the wider matrix of variables runs `streams.cli.main` in-process, which is the same code path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams.cli import main
from tests.support.env import router_env

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}
COMMANDS = {
    "config": ["config", "check"],
    "ingress": ["ingress", "--host", "127.0.0.1", "--port", "0"],
    "worker": ["worker", "--web-port", "0"],
    "sweep": ["sweep"],
    "replay": ["replay", "dlq", "--dry-run"],
    "audit": ["audit", "--verify"],
    "topics": ["topics"],
}


def good_config(tmp_path: Path) -> Path:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(CONFIG), encoding="utf-8")
    return path


def refused_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, **env: str
) -> str:
    """`streams.cli.main` with the environment of `refused`; same assertions, same line returned."""
    for name in list(os.environ):
        if name.startswith(("ROUTER_", "CHATWOOT_", "TYPESAFE_", "KAFKA_")):
            monkeypatch.delenv(name)
    for name, value in router_env(good_config(tmp_path), "127.0.0.1:1", "cli-test", **env).items():
        if name.startswith(("ROUTER_", "CHATWOOT_", "TYPESAFE_", "KAFKA_")):
            monkeypatch.setenv(name, value)
    try:
        code = main(COMMANDS[command])
    except SystemExit as exc:
        code = exc.code
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert len(stderr.splitlines()) == 1, stderr
    return stderr.splitlines()[0]


def refused(tmp_path: Path, command: str, config: Path | None = None, **env: str) -> str:
    """Run the command; assert exit 2 and one stderr line without a traceback; return that line."""
    environment = router_env(config or good_config(tmp_path), "127.0.0.1:1", "cli-test", **env)
    result = subprocess.run(
        [sys.executable, "-m", "streams.cli", *COMMANDS[command]],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return lines[0]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command", ["config", "ingress", "worker"])
def test_a_configuration_file_that_is_not_utf8(tmp_path: Path, command: str) -> None:
    config = write(tmp_path, "router.yaml", b"chatwoot:\n  baseUrl: http://caf\xe9.example\n")
    line = refused(tmp_path, command, config)
    assert line == f"Invalid CONFIG: {config}: line 2, column 22: not UTF-8 text"


@pytest.mark.parametrize("command", ["config", "ingress"])
def test_yaml_nested_5000_deep(tmp_path: Path, command: str) -> None:
    config = write(tmp_path, "router.yaml", b"chatwoot: " + b"[" * 5000 + b"]" * 5000 + b"\n")
    line = refused(tmp_path, command, config)
    assert line == f"Invalid CONFIG: {config}: line 1, column 42: nested more than 32 levels deep"


def test_json_nested_5000_deep(tmp_path: Path) -> None:
    config = write(tmp_path, "router.json", b'{"chatwoot": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert refused(tmp_path, "config", config) == f"Invalid CONFIG: {config}: nested more than 32 levels deep"


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    config = write(tmp_path, "router.yaml", b"chatwoot:\n  baseUrl: [x\nrouting: 1\n")
    line = refused(tmp_path, "config", config)
    assert line == f"Invalid CONFIG: {config}: line 3, column 8: expected ',' or ']', but got ':'"


def test_json_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    config = write(tmp_path, "router.json", b'{\n  "chatwoot": {"baseUrl": "http://x"\n  "routing": {}\n}\n')
    line = refused(tmp_path, "config", config)
    assert line == f"Invalid CONFIG: {config}: line 3, column 3: Expecting ',' delimiter"


def test_lone_surrogate_in_the_configuration(tmp_path: Path) -> None:
    document = json.loads(json.dumps(CONFIG))
    document["routing"]["accounts"]["3"]["sales"]["covers"] = "\udc80"
    config = write(tmp_path, "router.json", json.dumps(document).encode())
    line = refused(tmp_path, "config", config)
    assert line == "Invalid CONFIG: routing.accounts.3.sales.covers: not Unicode text (a lone surrogate)"


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        ("ingress", "ROUTER_PARTITIONS", "²"),
        ("worker", "ROUTER_RETRY_BASE_MS", "²"),
        ("ingress", "ROUTER_APP_ID", "a b"),
        ("worker", "ROUTER_SWEEP_INTERVAL_S", "inf"),
        ("sweep", "ROUTER_PARTITIONS", "٣"),
        ("audit", "ROUTER_RETRY_BASE_MS", "²"),
        ("replay", "ROUTER_APP_ID", "a/b"),
        ("topics", "ROUTER_LOG_RETENTION_MS", "30d"),
    ],
)
def test_a_bad_variable_is_one_line_and_exit_2(tmp_path: Path, command: str, variable: str, value: str) -> None:
    assert refused(tmp_path, command, **{variable: value}).startswith(f"Invalid environment: {variable}: must be ")


@pytest.mark.parametrize("command", ["config", "ingress", "worker", "sweep", "audit", "replay", "topics"])
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ROUTER_PARTITIONS", "²"),
        ("ROUTER_PARTITIONS", "0"),
        ("ROUTER_RETRY_BASE_MS", "²"),
        ("ROUTER_APP_ID", "a b"),
        ("ROUTER_SWEEP_INTERVAL_S", "inf"),
        ("ROUTER_SWEEP_INTERVAL_S", "nan"),
        ("ROUTER_PRODUCE_TIMEOUT_MS", "1e3"),
        ("ROUTER_READ_TIMEOUT_S", "-1"),
        ("ROUTER_KEEPALIVE_TIMEOUT_S", "0"),
        ("ROUTER_MAX_CONNECTIONS", "many"),
        ("KAFKA_BOOTSTRAP_SERVERS", "localhost:port"),
    ],
)
def test_every_command_refuses_a_bad_variable_alike(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: str,
    variable: str,
    value: str,
) -> None:
    line = refused_in_process(monkeypatch, capsys, tmp_path, command, **{variable: value})
    assert line.startswith(f"Invalid environment: {variable}: must be ")


def test_values_are_not_echoed(tmp_path: Path) -> None:
    line = refused(tmp_path, "ingress", ROUTER_APP_ID="hunter2 password")
    assert "hunter2" not in line


def test_a_variable_that_is_not_utf8(tmp_path: Path) -> None:
    line = refused(tmp_path, "ingress", ROUTER_APP_ID="caf\udce9")  # os.environ's form of the byte 0xE9
    assert line.startswith("Invalid environment: ROUTER_APP_ID: must be ")


def test_a_secret_with_a_control_character(tmp_path: Path) -> None:
    line = refused(tmp_path, "ingress", CHATWOOT_AGENT_BOT_SECRETS='{"3": "whsec\\u0000three"}')
    assert line == "Invalid secrets: CHATWOOT_AGENT_BOT_SECRETS: values must be printable text (no control characters)"


def test_a_worker_without_a_key_encryption_key_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    """Issue 32: the worker seals customer text; without the operator's KEK it never starts (not even to wait for
    Kafka), and a bad KEK is named, never shown."""
    line = refused(tmp_path, "worker", ROUTER_KEY_ENCRYPTION_KEY="")
    assert "ROUTER_KEY_ENCRYPTION_KEY" in line and "is not set" in line
    bad = "c2hvcnQga2V5"  # base64 of 9 bytes
    line = refused(tmp_path, "worker", ROUTER_KEY_ENCRYPTION_KEY=bad)
    assert "ROUTER_KEY_ENCRYPTION_KEY" in line and bad not in line
