"""The worker's table manager and table class: Faust's, with two changes (nothing in Faust is patched).

The table class keeps the future of every changelog write for the commit barrier (`Table`, below).

The table manager is Faust's, without the second it waits at start before tables may still be declared.

Faust's `TableManager.on_start` sleeps one second so that tables declared late (at import time of modules loaded
after the app starts) are registered before recovery starts. The worker declares every table in
`WorkerApp.__init__`, before the app starts, so that second only delays recovery — and with it `/healthz` and
routing — after every start, including a worker that waited for the broker (DESIGN §3). The app selects this
class through Faust's `TableManager` setting; nothing in Faust is patched.
"""

from __future__ import annotations

import weakref
from typing import Any

import faust
from faust.tables import TableManager as FaustTableManager

from handlers.worker.barrier import Barrier


class TableManager(FaustTableManager):
    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class Table(faust.Table):
    """Faust's table, whose changelog writes are tracked by the worker's commit barrier (handlers/worker/barrier.py).

    Faust sends a table write's changelog record with `send_soon` and only logs a failed send; this keeps the
    future of each (`send_changelog` is Faust's public method every write goes through) in the barrier of the
    app (`track_changelog`), so nothing relies on a state whose changelog record was not acknowledged. The app
    selects this class through Faust's `Table` setting."""

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        future = super().send_changelog(*args, **kwargs)
        barrier = _barriers.get(self.app)
        if barrier is not None:
            barrier.add(future)
        return future


_barriers: weakref.WeakKeyDictionary[Any, Barrier] = weakref.WeakKeyDictionary()


def track_changelog(app: Any, barrier: Barrier) -> None:
    """Every changelog write of `app`'s tables is added to `barrier`."""
    _barriers[app] = barrier
