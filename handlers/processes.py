"""Child processes the demo supervises: start, wait until ready, and stop them all cleanly.

Each child is one of this project's own commands (`python -m streams.cli …`), its output goes to a log file,
and readiness is a line it prints (`ready …`) or an HTTP health check. A child that exits early is reported
with the tail of its log, so the user sees why.
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


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _offset: int = field(default=0, repr=False)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ChildFailed(
                f"{self.name} exited with status {self.process.returncode}; its log ({self.log_path}) ends with:\n"
                f"{self.log_tail()}"
            )

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Wait until the child's log has a line matching `pattern`; returns the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                text = self.log_path.read_text(encoding="utf-8", errors="replace")
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

    def stop(self, timeout_s: float = 20) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Supervisor:
    """Starts children in order and stops them in reverse order."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "streams.cli", *args],
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops the children itself
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def check_all(self) -> None:
        for child in self.children:
            child.check_alive()

    def stop_all(self, on_stop: Callable[[str], None] | None = None) -> None:
        for child in reversed(self.children):
            if on_stop is not None and child.process.poll() is None:
                on_stop(child.name)
            child.stop()
