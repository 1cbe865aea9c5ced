"""What-if runs for the console's what-if page (DESIGN §8, §11): the CLI's path, off the web server's event loop.

A run is what `chatwoot-router whatif --config CANDIDATE` does without `--ask`: read the applied configuration
versions, plan the log (the window, one conversation's partition), re-decide every selected turn one partition
per task with `handlers.logs.whatif.whatif_partition`, `--jobs` processes at a time for a long log
(`handlers.logs.shards.run_sharded`, as the CLI), merge the partitions' `TurnTally`s (which keep the report's counts
and at most `ROW_CAP` rows of each kind) and make the same `Report` the CLI prints and `--html` writes. It runs in
a thread of its own, so the console's other pages keep answering, and counts the records it read for the page's
progress line. One run at a time; a few more wait their turn, and the last `KEPT` runs are kept (their reports
are capped as the CLI's are). Nothing here talks to Chatwoot or to System One.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from handlers.kafka.config_store import read_book
from handlers.logs.whatif import WhatifJob, plan_for, replay, work_of
from projections.whatif.report import Report
from projections.whatif.tally import CONVERSATION_HINT, Selection, duration_s, instant_ms, is_conversation_key
from schemas.config import MAX_CONFIG_BYTES, ConfigError, RouterConfig, load_config_file
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings

KEPT = 5  # finished runs kept (each report holds at most 2 × ROW_CAP rows)
WAITING = 3  # runs that may wait for the running one; more are refused
State = Literal["queued", "running", "done", "failed"]

_ACCOUNT = re.compile(r"[1-9][0-9]{0,15}")


class FormError(ValueError):
    """A field of the form that is not usable; `str()` is one line naming the field (as the CLI's options)."""


def parse_candidate(text: str | bytes, name: str = "candidate") -> RouterConfig:
    """The pasted or uploaded configuration, validated exactly as `config check` validates a file (the same
    reader: UTF-8, JSON or YAML, depth and size limits, the schema); a ConfigError names the key path, or the line
    and column of a syntax error, with `name` in place of the file's name."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("CONFIG", name, f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    with tempfile.TemporaryDirectory(prefix="console-whatif-") as scratch:
        path = Path(scratch) / "candidate"
        path.write_bytes(data)
        try:
            return load_config_file(path)
        except ConfigError as exc:
            shown = name if exc.path == str(path) else exc.path
            raise ConfigError(exc.source, shown, exc.reason) from None


def since_s(text: str) -> int:
    """The form's `since` (the CLI's `--since`) in seconds; FormError names the field."""
    try:
        return duration_s(text)
    except ValueError as exc:
        raise FormError(f"since: {text.strip()!r} is not {exc}") from None


def from_ms(text: str) -> int:
    """The form's `from` (the CLI's `--from`) in epoch milliseconds; FormError names the field."""
    try:
        return instant_ms(text)
    except ValueError as exc:
        raise FormError(f"from: {text.strip()!r} is not {exc}") from None


@dataclass(frozen=True)
class WhatifRequest:
    """A candidate and the turns to compare (the CLI's `--since`/`--from`, `--account`, `--conversation`)."""

    candidate: RouterConfig
    since: str = ""
    start: str = ""  # the --from time as given
    account: str = ""
    conversation: str = ""

    @classmethod
    def of(cls, candidate: RouterConfig, since: str, start: str, account: str, conversation: str) -> WhatifRequest:
        """Validated like the CLI's options (FormError names the field)."""
        since, start, account, conversation = since.strip(), start.strip(), account.strip(), conversation.strip()
        if since and start:
            raise FormError("since, from: give one of them, not both")
        if since:
            since_s(since)
        if start:
            from_ms(start)
        if account and _ACCOUNT.fullmatch(account) is None:
            raise FormError(f"account: {account!r} is not an account id")
        if conversation and not is_conversation_key(conversation):
            raise FormError(f"conversation: {conversation!r} is not {CONVERSATION_HINT}")
        return cls(candidate, since, start, account, conversation)

    def selection(self, now_ms: int) -> Selection:
        start = now_ms - since_s(self.since) * 1000 if self.since else from_ms(self.start) if self.start else None
        return Selection(
            from_ms=start,
            account_id=int(self.account) if self.account else None,
            key=self.conversation or None,
        )

    def command(self) -> str:
        """The same what-if on the command line (where `--ask` is)."""
        words = ["chatwoot-router whatif --config CANDIDATE"]
        if self.since:
            words.append(f"--since {self.since}")
        if self.start:
            words.append(f"--from {self.start}")
        if self.account:
            words.append(f"--account {self.account}")
        if self.conversation:
            words.append(f"--conversation {self.conversation}")
        return " ".join(words)

    def window(self) -> str:
        if self.since:
            parts = [f"turns of the last {self.since}"]
        else:
            parts = [f"turns from {self.start}" if self.start else "every turn"]
        if self.account:
            parts.append(f"account {self.account}")
        if self.conversation:
            parts.append(f"conversation {self.conversation}")
        return ", ".join(parts)


@dataclass
class RunProgress:
    """Records read so far against the planned total (updated from the run's thread or the pool's drain thread)."""

    total: int = 0
    done: int = 0
    partitions: int = 0

    def __call__(self, partition: int, records: int) -> None:
        self.done += records

    @property
    def percent(self) -> int:
        return min(100, self.done * 100 // self.total) if self.total else 0


@dataclass
class WhatifRun:
    """One what-if as the page shows it: queued, running (with progress), done (its report) or failed (why)."""

    id: str
    request: WhatifRequest
    candidate_version: str
    state: State = "queued"
    progress: RunProgress = field(default_factory=RunProgress)
    submitted_s: float = field(default_factory=time.monotonic)
    started_s: float | None = None
    finished_s: float | None = None
    report: Report | None = None
    error: str | None = None
    note: str | None = None  # the log lost records from its head: from when the history is complete
    report_html: str | None = field(default=None, repr=False)  # the page's rendering of `report` (made once)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def elapsed_s(self) -> float:
        if self.started_s is None:
            return 0.0
        return (self.finished_s or time.monotonic()) - self.started_s


Execute = Callable[[WhatifRun], Report]


class RunsBusy(RuntimeError):
    """Too many runs are waiting; the page says so and links to them."""


class WhatifRunner:
    """Runs what-ifs one at a time in a thread (see the module), keeps the last `KEPT` and hands them to the page.

    `execute(run)` makes the report (it may block for minutes; it updates `run.progress`); by default the CLI's
    path over the log (`log_whatif`). A test passes its own.
    """

    def __init__(
        self,
        bootstrap: str,
        app_id: str,
        *,
        retry_base_ms: int = 5000,
        config: RouterConfig | None = None,
        jobs: int | None = None,
        execute: Execute | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.bootstrap, self.app_id = bootstrap, app_id
        self.retry_base_ms = retry_base_ms
        self.config = config  # for a log without applied versions (the console's --config / ROUTER_CONFIG)
        self.jobs = jobs
        self.clock_ms = clock_ms
        self.execute: Execute = execute or self.log_whatif
        self.runs: OrderedDict[str, WhatifRun] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def topic(self) -> str:
        return f"{self.app_id}.conversations"

    async def book(self) -> ConfigBook:
        """The applied configuration versions (to start a candidate from), as `whatif` reads them."""
        return await read_book(self.bootstrap, self.app_id)

    def version_of(self, candidate: RouterConfig) -> str:
        return ConfigDocument.of(candidate, FoldSettings(retry_base_ms=self.retry_base_ms)).version

    def submit(self, request: WhatifRequest) -> WhatifRun:
        waiting = sum(1 for r in self.runs.values() if r.state == "queued")
        if waiting >= WAITING:
            raise RunsBusy(f"{waiting} what-ifs are waiting already; try again when they are done")
        run = WhatifRun(f"w{next(self._ids)}", request, self.version_of(request.candidate))
        self.runs[run.id] = run
        task = asyncio.create_task(self._run(run), name=f"console-whatif-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._forget()
        return run

    def get(self, run_id: str) -> WhatifRun | None:
        return self.runs.get(run_id)

    def _forget(self) -> None:
        finished = [r.id for r in self.runs.values() if r.finished]
        for run_id in finished[: max(0, len(finished) - KEPT)]:
            del self.runs[run_id]

    async def _run(self, run: WhatifRun) -> None:
        async with self._lock:
            run.state, run.started_s = "running", time.monotonic()
            try:
                run.report = await _in_thread(self.execute, run)
                run.state = "done"
            except ConfigError as exc:
                run.state, run.error = "failed", str(exc)
            except Exception as exc:  # Kafka away, a partition's task failed: one line, never a traceback
                run.state, run.error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                run.finished_s = time.monotonic()
                self._forget()

    def log_whatif(self, run: WhatifRun) -> Report:
        """`whatif` without `--ask` over the log, by the CLI's steps (`handlers.logs.whatif.plan_for`, `replay`)."""
        request, candidate = run.request, run.request.candidate
        book = asyncio.run(read_book(self.bootstrap, self.app_id))
        if not len(book):
            if self.config is None:
                raise ConfigError(
                    "CONFIG", "", "no configuration version was ever applied and the console has no --config"
                )
            book = ConfigBook([ConfigDocument.of(self.config, FoldSettings(retry_base_ms=self.retry_base_ms))])
        selection = request.selection(self.clock_ms())
        job = WhatifJob(self.bootstrap, self.topic, book, candidate, selection, window=selection.from_ms is not None)
        planned = asyncio.run(plan_for(job))
        if planned.history.is_partial:
            run.note = planned.history.describe()
        work = work_of(job, planned)
        run.progress.total = sum(work.values())
        run.progress.partitions = len(work)
        tally = replay(job, planned, self.jobs, run.progress)
        return tally.report(run.candidate_version)


async def _in_thread(execute: Execute, run: WhatifRun) -> Report:
    """`execute(run)` in a daemon thread: the event loop stays free, and a console stopped meanwhile exits without
    waiting for it (its pool's processes are daemonic and end with it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Report] = loop.create_future()

    def settle(result: Report | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            assert result is not None
            done.set_result(result)

    def work() -> None:
        result: Report | None = None
        error: BaseException | None = None
        try:
            result = execute(run)
        except BaseException as exc:  # handed to the awaiting task, which reports it
            error = exc
        with contextlib.suppress(RuntimeError):  # the console stopped meanwhile: its loop is closed
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=f"whatif-{run.id}", daemon=True).start()
    return await done
