"""The worker's environment (DESIGN §3): broker, app id, partitions, data dir, retry base, sweep interval.

Read once at start and validated like the configuration: a bad value is a `ConfigError` naming the
variable, so `chatwoot-router worker` exits 2 before touching Kafka.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas.config import ConfigError

DEFAULT_APP_ID = "chatwoot-router"
DEFAULT_BOOTSTRAP = "localhost:9092"


@dataclass(frozen=True)
class WorkerEnv:
    """Process settings that are not part of the routing configuration."""

    app_id: str = DEFAULT_APP_ID
    bootstrap: str = DEFAULT_BOOTSTRAP
    partitions: int = 12
    data_dir: Path = Path("data")
    retry_base_ms: int = 5000
    sweep_interval_s: float = 300.0

    def topic(self, name: str) -> str:
        """`<app>.<name>`: conversations, effects, sweeps, dlq."""
        return f"{self.app_id}.{name}"


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError("environment", name, "must be a positive integer")
    return int(raw)


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError("environment", name, "must be a positive number") from None
    if not value > 0:
        raise ConfigError("environment", name, "must be a positive number")
    return value


def read_worker_env(environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """Read KAFKA_BOOTSTRAP_SERVERS, ROUTER_APP_ID, ROUTER_PARTITIONS, ROUTER_DATA_DIR, ROUTER_RETRY_BASE_MS
    and ROUTER_SWEEP_INTERVAL_S (defaults of DESIGN §3)."""
    env = os.environ if environ is None else environ
    app_id = (env.get("ROUTER_APP_ID") or DEFAULT_APP_ID).strip()
    if not app_id or any(c in app_id for c in " /\\:"):
        raise ConfigError("environment", "ROUTER_APP_ID", "must be a non-empty name without spaces, slashes or ':'")
    return WorkerEnv(
        app_id=app_id,
        bootstrap=(env.get("KAFKA_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP).strip(),
        partitions=_positive_int(env, "ROUTER_PARTITIONS", 12),
        data_dir=Path(env.get("ROUTER_DATA_DIR") or "data"),
        retry_base_ms=_positive_int(env, "ROUTER_RETRY_BASE_MS", 5000),
        sweep_interval_s=_positive_float(env, "ROUTER_SWEEP_INTERVAL_S", 300.0),
    )
