"""The Faust worker (DESIGN §3): router agent, effect agent, sweeper, durable timers, health and metrics."""

from streams.worker.app import WorkerApp, build_worker
from streams.worker.env import WorkerEnv, read_worker_env

__all__ = ["WorkerApp", "WorkerEnv", "build_worker", "read_worker_env"]
