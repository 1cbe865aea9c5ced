"""Child processes of this project's own commands: start, wait until ready, stop, kill. The one supervisor of the
demo, the tests (`tests/support/processes.py`) and the kill-loop test (`bench/chaos.py`).

Each child is one of this project's modules run by the same interpreter (`python -m streams.cli …`), its stdout
and stderr go to one log file, and readiness is a line it prints (`ready …`) or an HTTP health check. A child
that exits early is reported with the tail of its log, so the user sees why. Stopping is SIGTERM (or the signal
given), then SIGKILL once the timeout is up.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


class ChildFailed(RuntimeError):
    """A child exited or did not become ready; the message names it and quotes its log's tail."""


class Child:
    """One project command as a child process, its output in `log_path`. It can be started again once it stopped.

    `append` keeps the output of earlier starts in the log (else each start truncates it); `new_session` puts the
    child in a session of its own, so a Ctrl-C reaches only the parent, which stops its children itself.
    """

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        append: bool = False,
        new_session: bool = True,
        module: str = "streams.cli",
    ) -> None:
        self.name, self.args, self.env, self.log_path = name, args, env, log_path
        self.cwd, self.append, self.new_session, self.module = cwd, append, new_session, module
        self.popen: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where this start's output begins in the log

    def start(self) -> None:
        with self.log_path.open("ab" if self.append else "wb") as log:
            self._log_start = log.tell()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.new_session,
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise ChildFailed(
                f"{self.name} exited with status {self.returncode}; its log ({self.log_path}) ends with:\n"
                f"{self.log_tail()}"
            )

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Wait until the child has printed a line matching `pattern` since it was started; returns the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with self.log_path.open("rb") as log:
                    log.seek(self._log_start)
                    text = log.read().decode("utf-8", errors="replace")
            except OSError:
                text = ""
            for line in text.splitlines():
                match = regex.search(line)
                if match:
                    return match
            self.check_alive()
            time.sleep(0.1)
        raise ChildFailed(f"{self.name} was not ready within {timeout_s:.0f} s; see {self.log_path}")

    def wait_for_http(self, url: str, timeout_s: float) -> None:
        """Wait until `url` answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            time.sleep(0.25)
        raise ChildFailed(f"{self.name} did not answer {url} within {timeout_s:.0f} s; see {self.log_path}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        """Send `sig` and wait up to `timeout_s` for the child to exit, then SIGKILL it."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


@dataclass
class Supervisor:
    """Starts children in order and stops them in reverse order."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Child:
        child = Child(name, args, {**self.env, **(extra_env or {})}, self.log_dir / f"{name}.log")
        child.start()
        self.children.append(child)
        return child

    def check_all(self) -> None:
        for child in self.children:
            child.check_alive()

    def stop_all(self, on_stop: Callable[[str], None] | None = None) -> None:
        for child in reversed(self.children):
            if on_stop is not None and child.alive():
                on_stop(child.name)
            child.stop()
