"""Faust's worker as the `worker` command runs it (streams/worker_cmd.py)."""

from __future__ import annotations

import faust


class RouterWorker(faust.Worker):
    """Faust's worker, remembering the exception that failed its start (mode logs it and exits 1), so the command
    can tell a broker fault from a fault of its own."""

    start_error: BaseException | None = None

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as exc:
            self.start_error = exc
            raise
