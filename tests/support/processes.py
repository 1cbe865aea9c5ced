"""A `chatwoot-router` command as a child of a test: `handlers.processes.Child`, the demo's own supervisor, set up
the way the tests have always run their children."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from handlers.processes import Child

ROOT = Path(__file__).resolve().parents[2]  # the repository: children run from here


def run_cli(
    env: dict[str, str], *args: str, timeout_s: float = 180, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """`chatwoot-router ARGS` run to its end from the repository (or the source tree `cwd`) with `env`, its output
    captured."""
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


_RUNNING: dict[str, tuple[str, Callable[[], object], Callable[[], bool]]] = {}


def remember_child(name: str, stop: Callable[[], object], alive: Callable[[], bool] = lambda: True) -> None:
    """Note something a test started (a broker, a process) so the session stops it if the test could not."""
    _RUNNING[name] = (name, stop, alive)


def stop_every_child() -> list[str]:
    """Stop whatever is still running of what tests started; returns the names of what had to be stopped."""
    stopped = []
    for name, stop, alive in list(_RUNNING.values()):
        if alive():
            stopped.append(name)
            try:
                stop()
            except Exception as exc:  # one that cannot be stopped must not keep the others running
                stopped.append(f"{name} (stop failed: {exc!r})")
    _RUNNING.clear()
    return stopped


class Process(Child):
    """A `chatwoot-router` subcommand as a subprocess, its output in `<log_dir>/<name>.log`.

    It runs from the repository, stays in the test's process group (an interrupted test run takes it down too)
    and appends each start to the same log, so a restarted worker's log has both runs.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        super().__init__(name, args, env, log_dir / f"{name}.log", cwd=ROOT, append=True, new_session=False)

    def start(self) -> None:
        super().start()
        remember_child(f"{self.name} ({self.log_path})", self._stop_at_session_end, self.alive)

    def _stop_at_session_end(self) -> None:
        self.stop(signal.SIGKILL, 10)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
        """`sig` (SIGKILL for a crash), then SIGKILL if the process is still there after `timeout_s`."""
        super().stop(sig, timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return super().log_tail(lines)
