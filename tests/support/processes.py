"""A `chatwoot-router` command as a child of a test: `handlers.processes.Child`, the demo's own supervisor, set up
the way the tests have always run their children."""

from __future__ import annotations

import signal
from pathlib import Path

from handlers.processes import Child

ROOT = Path(__file__).resolve().parents[2]  # the repository: children run from here


class Process(Child):
    """A `chatwoot-router` subcommand as a subprocess, its output in `<log_dir>/<name>.log`.

    It runs from the repository, stays in the test's process group (an interrupted test run takes it down too)
    and appends each start to the same log, so a restarted worker's log has both runs.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        super().__init__(name, args, env, log_dir / f"{name}.log", cwd=ROOT, append=True, new_session=False)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
        """`sig` (SIGKILL for a crash), then SIGKILL if the process is still there after `timeout_s`."""
        super().stop(sig, timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return super().log_tail(lines)
