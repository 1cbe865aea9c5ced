"""The System One ("Jev") client: one POST per decision (behavior.md §7).

The request body and the reading of the answer are pure (projections/jev.py); this module only moves bytes.
The API key travels as a bearer token, so redirects are refused: the key must never reach another host.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from handlers.clients.http_client import new_http_client
from projections.jev import (
    Decision,
    JevError,
    asked_options,
    build_request,
    encode_request,
    read_decision,
)
from schemas.config import RouterConfig

TIMEOUT_S = 60.0


class JevNetworkError(JevError):
    """No response from System One (connection refused or reset, DNS, protocol error)."""


class JevTimeout(JevNetworkError):
    """No complete response within 60 seconds, body included."""


class JevHTTPError(JevError):
    """A non-2xx answer (3xx included): `TypeSafe Jev: HTTP <status>`."""

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"TypeSafe Jev: HTTP {status}")


class SystemOneClient:
    """Posts request bodies to System One; `requests` counts the HTTP requests made (one per call)."""

    def __init__(
        self,
        endpoint: str,
        api_key: str,
        *,
        http: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self._endpoint = endpoint
        self._api_key = api_key
        self._http = http or new_http_client(transport)
        self._owns_http = http is None
        self._timeout_s = timeout_s
        self.requests = 0

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> SystemOneClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def post(self, body: dict[str, Any]) -> object:
        """Sends one request body; returns the parsed JSON answer (unvalidated)."""
        self.requests += 1
        headers = {"authorization": f"Bearer {self._api_key}", "content-type": "application/json"}
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._http.post(
                    self._endpoint,
                    content=encode_request(body),
                    headers=headers,
                    follow_redirects=False,
                    timeout=self._timeout_s,
                )
        except (TimeoutError, httpx.TimeoutException):
            raise JevTimeout("TypeSafe Jev: timed out") from None
        except httpx.HTTPError:
            raise JevNetworkError("TypeSafe Jev: network error") from None
        if not 200 <= response.status_code < 300:
            raise JevHTTPError(response.status_code)
        try:
            answer: object = response.json()
        except ValueError:
            raise JevError("TypeSafe Jev: invalid response") from None
        return answer

    async def decide(self, body: dict[str, Any], min_confidence: float) -> Decision:
        """Asks the questions of `body` (built by `projections.jev.build_request`) and reads the decision."""
        answer = await self.post(body)
        return read_decision(answer, asked_options(body), min_confidence)

    async def decide_ticket(self, config: RouterConfig, account_id: int, ticket: str) -> Decision:
        """Builds the account's request for `ticket` (already redacted) and decides with its minConfidence."""
        body = build_request(config, account_id, ticket)
        return await self.decide(body, config.routing.min_confidence)
