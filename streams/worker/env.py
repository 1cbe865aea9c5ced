"""The worker's environment (DESIGN §3): broker, app id, partitions, data dir, retry base, sweep interval.

Read once at start through the one settings model every command uses (`schemas.config.RouterEnv`), so the
worker, the ingress and the operator commands accept and refuse exactly the same values: a bad value is a
`ConfigError` naming the variable, and `chatwoot-router worker` exits 2 before touching Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas.config import DEFAULT_APP_ID, DEFAULT_BOOTSTRAP, RouterEnv, read_env

__all__ = ["DEFAULT_APP_ID", "DEFAULT_BOOTSTRAP", "WorkerEnv", "read_worker_env"]


@dataclass(frozen=True)
class WorkerEnv:
    """Process settings that are not part of the routing configuration."""

    app_id: str = DEFAULT_APP_ID
    bootstrap: str = DEFAULT_BOOTSTRAP
    partitions: int = 12
    data_dir: Path = Path("data")
    retry_base_ms: int = 5000
    sweep_interval_s: float = 300.0
    worker_id: str | None = None
    fresh_read_ms: int = 5000
    settings_reuse_ms: int = 5000  # ROUTER_SETTINGS_REUSE_MS: an inbox's bot and an account's agents read once per
    log_retention_ms: int | None = None  # ROUTER_LOG_RETENTION_MS: None keeps the event log forever
    commit_interval_ms: int = 2800  # ROUTER_COMMIT_INTERVAL_MS: write cache and offsets at least this often
    chatwoot_version: str | None = None  # ROUTER_CHATWOOT_VERSION: stated when a proxy hides GET /api
    chatwoot_requests_per_min: int = 2400  # ROUTER_CHATWOOT_REQUESTS_PER_MIN: the group's, split by partitions
    text_retention_days: float | None = None  # ROUTER_TEXT_RETENTION_DAYS: None keeps text until `forget`
    erasure_deadline_ms: int = 604_800_000  # ROUTER_ERASURE_DEADLINE_MS: an erased key compacted away by then

    def topic(self, name: str) -> str:
        """`<app>.<name>`: conversations, effects, sweeps, dlq."""
        return f"{self.app_id}.{name}"

    @classmethod
    def from_router_env(cls, env: RouterEnv) -> WorkerEnv:
        return cls(
            app_id=env.app_id,
            bootstrap=env.bootstrap,
            partitions=env.partitions,
            data_dir=env.data_dir,
            retry_base_ms=env.retry_base_ms,
            sweep_interval_s=env.sweep_interval_s,
            worker_id=env.worker_id,
            fresh_read_ms=env.fresh_read_ms,
            settings_reuse_ms=env.settings_reuse_ms,
            log_retention_ms=env.log_retention_ms,
            commit_interval_ms=env.commit_interval_ms,
            chatwoot_version=env.chatwoot_version,
            chatwoot_requests_per_min=env.chatwoot_requests_per_min,
            text_retention_days=env.text_retention_days,
            erasure_deadline_ms=env.erasure_deadline_ms,
        )


def read_worker_env(environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """Read KAFKA_BOOTSTRAP_SERVERS, ROUTER_APP_ID, ROUTER_PARTITIONS, ROUTER_DATA_DIR, ROUTER_RETRY_BASE_MS
    and ROUTER_SWEEP_INTERVAL_S (defaults of DESIGN §3); raises ConfigError naming a bad variable."""
    return WorkerEnv.from_router_env(read_env(environ))
