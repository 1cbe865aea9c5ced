"""The worker touches a Chatwoot only once it knows it is recent enough (issue 30, projections/chatwoot_version.py).

At start and every few minutes the worker asks Chatwoot for its version (`GET /api`, no token). While the version
is below the minimum, or cannot be learned, the gate is closed: every command waits in its lane before it is run
(no read, no mutation, no handoff, no System One call), so nothing counts as a failure and no conversation is
handed off for it; `/healthz` and `/stuck` say why in one line and `router_chatwoot_held` says so as a metric.
When the version is right the gate opens by itself and the waiting commands run (those their runs moved past are
dropped as usual, a mutation still needs its fresh read).

A version that cannot be learned (no answer, or a proxy that serves only `/api/v1`) keeps the gate closed too:
routing on an unknown Chatwoot is exactly the silent degradation the check exists to prevent. An operator whose
proxy hides `/api` states the version instead (`ROUTER_CHATWOOT_VERSION`); the worker then trusts it, and says so.
Once a version was learned, a re-check that gets no answer (a 429 from Chatwoot's rate limit, which counts this
request too, a timeout, a restart) keeps it: the gate stays as it was and the worker asks again within
RETRY_EVERY_S. Only an answer closes an open gate; otherwise a busy installation at its rate limit would stop
routing for 15 s at every unlucky re-check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from projections.chatwoot_version import MIN_CHATWOOT, version_problem

log = logging.getLogger("chatwoot_router.worker")

CHECK_EVERY_S = 300.0  # while the version is right
RETRY_EVERY_S = 15.0  # while it is not, or is unknown: routing resumes within this of an upgrade


class ChatwootGate:
    """Open while the Chatwoot at `base_url` reports a version the router supports."""

    def __init__(
        self,
        base_url: str,
        fetch_version: Callable[[], Awaitable[str]] | None,
        *,
        stated_version: str | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.base_url = base_url
        self.fetch_version = fetch_version
        self.stated_version = stated_version
        self.on_change = on_change
        self.version: str | None = stated_version
        self.reason: str | None = None if fetch_version is None else "Chatwoot's version not checked yet"
        self._open = asyncio.Event()
        self._unanswered = False  # the last re-check got no answer: ask again soon
        if self.reason is None:
            self._open.set()

    @classmethod
    def always_open(cls) -> ChatwootGate:
        """A gate that never closes (tests of the service without a Chatwoot)."""
        return cls("", None)

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait(self) -> None:
        """Return once the gate is open (at once while it is)."""
        if not self._open.is_set():
            await self._open.wait()

    async def check(self) -> None:
        """Ask Chatwoot for its version (unless the operator stated it) and open or close the gate."""
        if self.fetch_version is None:
            return
        version, learned = self.stated_version, "stated in ROUTER_CHATWOOT_VERSION"
        self._unanswered = False
        if version is None:
            try:
                version, learned = await self.fetch_version(), "reported on GET /api"
            except Exception as exc:  # no answer, a proxy without /api, not JSON: the version stays unknown
                if self.is_open and self.version is not None:
                    self._unanswered = True  # the version it learned stands until an answer says otherwise
                    log.warning(
                        "Chatwoot's version could not be checked again; routing on the one it reported",
                        extra={"version": self.version, "error_type": type(exc).__name__},
                    )
                    return
                version, learned = None, f"GET /api failed: {type(exc).__name__}"
        self.version = version
        problem = version_problem(version)
        if problem is None:
            self._set(None, f"Chatwoot {version} ({learned}) meets the minimum {MIN_CHATWOOT}: routing")
        else:
            hint = "; set ROUTER_CHATWOOT_VERSION if a proxy hides GET /api" if version is None else ""
            self._set(
                f"Chatwoot at {self.base_url}: {problem} ({learned}); nothing is routed until it is {MIN_CHATWOOT} "
                f"or newer{hint}",
                None,
            )

    async def run(self) -> None:
        """Check now and then every CHECK_EVERY_S (every RETRY_EVERY_S while closed), until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(CHECK_EVERY_S if self.is_open and not self._unanswered else RETRY_EVERY_S)

    def _set(self, reason: str | None, opened: str | None) -> None:
        changed = (reason is None) != self.is_open or reason != self.reason
        self.reason = reason
        if reason is None:
            if changed:
                log.info(opened)
            self._open.set()
        else:
            if changed:
                log.error(reason)
            self._open.clear()
        if changed and self.on_change is not None:
            self.on_change(self.is_open)
