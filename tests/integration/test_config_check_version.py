"""`chatwoot-router config check` asks Chatwoot for its version as a worker does (issue 30): too old is exit 1
with one line saying a worker routes nothing; unreachable is a warning only; `--offline` does not ask."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest

from sandbox import run_sandbox
from sandbox.scenario import SAMPLE
from streams.kafka.local import free_port
from tests.support.env import router_env

ROOT = Path(__file__).resolve().parents[2]


def config_for(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "router.json"
    config = {
        "chatwoot": {"baseUrl": base_url},
        "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


async def check(config: Path, *args: str, **env: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        "config",
        "check",
        *args,
        cwd=ROOT,
        env=router_env(config, "127.0.0.1:9", "cfg", **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(("version", "code"), [("4.18.0", 0), ("4.15.1", 1)])
async def test_config_check_reports_the_chatwoot_version(tmp_path: Path, version: str, code: int) -> None:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE)) as sandbox:
        sandbox.world.chatwoot_version = version
        returncode, out, err = await check(config_for(tmp_path, sandbox.url))
    assert returncode == code, (out, err)
    if code == 0:
        assert f"chatwoot ok: {sandbox.url} version {version} (GET /api)" in out
    else:
        assert "older than 4.17.0" in err and "routes nothing" in err and len(err.strip().splitlines()) == 1


async def test_a_stated_version_is_checked_without_asking(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    returncode, _, err = await check(config_for(tmp_path, nowhere), ROUTER_CHATWOOT_VERSION="4.16.3")
    assert returncode == 1 and "4.16.3" in err and "ROUTER_CHATWOOT_VERSION" in err


async def test_an_unreachable_chatwoot_is_a_warning_and_offline_does_not_ask(tmp_path: Path) -> None:
    config = config_for(tmp_path, f"http://127.0.0.1:{free_port()}")
    returncode, out, err = await check(config)
    assert returncode == 0 and "configuration ok" in out and err.startswith("warning: Chatwoot at")
    returncode, out, err = await check(config, "--offline")
    assert returncode == 0 and err == "" and "chatwoot ok" not in out
