"""The worker's table manager: Faust's, without the second it waits at start before tables may still be declared.

Faust's `TableManager.on_start` sleeps one second so that tables declared late (at import time of modules loaded
after the app starts) are registered before recovery starts. The worker declares every table in
`WorkerApp.__init__`, before the app starts, so that second only delays recovery — and with it `/healthz` and
routing — after every start, including a worker that waited for the broker (DESIGN §3). The app selects this
class through Faust's `TableManager` setting; nothing in Faust is patched.
"""

from __future__ import annotations

from faust.tables import TableManager as FaustTableManager


class TableManager(FaustTableManager):
    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
