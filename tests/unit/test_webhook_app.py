"""The ingress HTTP app over real loopback HTTP, with an in-memory writer standing in for Kafka.

Every status code of behavior.md §3.2, the body limit, /healthz, /metrics, 404s, logs that never show a
secret or a body, and a fuzz property: bad input never gets a 5xx and never becomes a record.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.ingress.door import WEBHOOK_PATH, SettingsFile, create_app
from handlers.logging_setup import JsonFormatter
from projections.webhook import sign
from schemas.config import ConfigError, Secrets, Settings, parse_config
from schemas.records import WebhookReceived
from tests.support.strategies import json_like

NOW_MS = 1_790_000_000_250
NOW_S = "1790000000"
SECRETS = {1: "whsec-account-one", 2: "whsec-account-two"}
TWO_MIB = 2 * 1024 * 1024  # behavior.md §3.2 step 0 (Decisions 1): larger bodies get 413, exactly 2 MiB is accepted
CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {
        "botIds": {"1": 11, "2": 12},
        "accounts": {
            "1": {"billing": {"assignee": 5, "covers": "Invoices."}},
            "2": {"support": {"assignee": 6, "covers": "Everything."}},
        },
    },
}
SETTINGS = Settings(
    config=parse_config(CONFIG),
    secrets=Secrets(
        chatwoot_token="user-token",
        agent_bot_tokens={1: "bot-token-1", 2: "bot-token-2"},
        agent_bot_secrets=SECRETS,
        typesafe_api_key="tsk",
    ),
)


class MemoryWriter:
    """Records what would have been made durable (decoded from the bytes it was given); can fail or hang."""

    def __init__(self) -> None:
        self.records: list[WebhookReceived] = []
        self.keys: list[str] = []
        self.fail: BaseException | None = None
        self.hang = False
        self.closed = False

    async def writable(self) -> bool:
        return self.fail is None and not self.hang

    async def write(self, key: str, value: bytes) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail
        record = WebhookReceived.model_validate_json(value)
        assert record.key == key
        self.keys.append(key)
        self.records.append(record)

    async def close(self) -> None:
        self.closed = True


def message(account: int = 1, conversation: int = 42, **overrides: Any) -> bytes:
    payload: dict[str, Any] = {
        "event": "message_created",
        "account": {"id": account},
        "id": 900,
        "conversation": {"id": conversation},
        "message_type": "incoming",
        "private": False,
        "content": "my password is hunter2",
        "sender": {"id": 3, "name": "Jo Customer", "email": "jo@example.com"},
    }
    payload.update(overrides)
    return json.dumps(payload, separators=(",", ":")).encode()


def signed(body: bytes, secret: str = SECRETS[1], ts: str = NOW_S, delivery: str | None = "d-1") -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "X-Chatwoot-Timestamp": ts,
        "X-Chatwoot-Signature": sign(secret, ts, body),
    }
    if delivery is not None:
        headers["X-Chatwoot-Delivery"] = delivery
    return headers


class Door:
    """A running app on 127.0.0.1:<port 0> and a client session for it."""

    def __init__(self, server: TestServer, session: ClientSession, writer: MemoryWriter) -> None:
        self.server = server
        self.session = session
        self.writer = writer

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def post(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
        data = io.BytesIO(body)  # large bodies as a stream, as aiohttp asks
        async with self.session.post(self.url(WEBHOOK_PATH), data=data, headers=headers or {}) as response:
            return response.status, await response.text()


async def start_door(settings: Callable[[], Settings], **kwargs: Any) -> tuple[Door, Callable[[], Any]]:
    writer = MemoryWriter()
    app = create_app(settings=settings, writer=writer, clock_ms=lambda: NOW_MS, **kwargs)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    session = ClientSession()

    async def stop() -> None:
        await session.close()
        await server.close()

    return Door(server, session, writer), stop


@pytest.fixture
async def door() -> AsyncIterator[Door]:
    running, stop = await start_door(lambda: SETTINGS, produce_timeout_s=0.3)
    yield running
    await stop()


# --- the happy path and each status code ----------------------------------------------------------------


async def test_signed_incoming_message_is_written_then_acknowledged(door: Door) -> None:
    body = message()
    assert await door.post(body, signed(body)) == (200, '{"ok":true}')
    assert door.writer.records == [
        WebhookReceived(at_ms=NOW_MS, account_id=1, conversation_id=42, event="message_created", delivery_id="d-1")
    ]


async def test_replayed_delivery_is_accepted_again_with_its_delivery_id(door: Door) -> None:
    body = message()
    for _ in range(2):
        assert await door.post(body, signed(body, delivery="same-uuid")) == (200, '{"ok":true}')
    assert [r.delivery_id for r in door.writer.records] == ["same-uuid", "same-uuid"]


async def test_stale_timestamp_is_401(door: Door) -> None:
    body = message()
    assert await door.post(body, signed(body, ts="1789999699")) == (401, "invalid or stale timestamp")
    assert await door.post(body, {"X-Chatwoot-Signature": sign(SECRETS[1], NOW_S, body)}) == (
        401,
        "invalid or stale timestamp",
    )
    assert door.writer.records == []


async def test_wrong_secret_is_401(door: Door) -> None:
    body = message()
    assert await door.post(body, signed(body, secret="guess")) == (401, "invalid signature")
    assert door.writer.records == []


async def test_upper_case_signature_header_is_accepted(door: Door) -> None:
    body = message()
    headers = signed(body)
    headers["X-Chatwoot-Signature"] = headers["X-Chatwoot-Signature"].upper()
    assert await door.post(body, headers) == (200, '{"ok":true}')


async def test_signed_non_json_is_400(door: Door) -> None:
    body = b"\xc3\x28 not json"
    assert await door.post(body, signed(body)) == (400, "bad request")
    assert door.writer.records == []


async def test_irrelevant_event_is_200_ignored(door: Door) -> None:
    body = message(message_type="outgoing", sender={"id": 1, "type": "agent_bot"})
    assert await door.post(body, signed(body)) == (200, '{"ok":true,"ignored":true}')
    assert door.writer.records == []


async def test_event_naming_another_account_is_403(door: Door) -> None:
    body = message(account=2)
    assert await door.post(body, signed(body, secret=SECRETS[1])) == (
        403,
        "account does not match the webhook secret",
    )
    assert door.writer.records == []


async def test_settings_that_fail_to_load_give_500(tmp_path: Any) -> None:
    running, stop = await start_door(SettingsFile(str(tmp_path / "missing.yaml"), environ={}))
    try:
        body = message()
        assert await running.post(body, signed(body)) == (500, "internal error")
        async with running.session.get(running.url("/healthz")) as response:
            assert response.status == 503
            assert (await response.json())["ok"] is False
    finally:
        await stop()


async def test_kafka_failure_is_500_and_nothing_acknowledged(door: Door) -> None:
    door.writer.fail = ConnectionError("broker down")
    body = message()
    assert await door.post(body, signed(body)) == (500, "internal error")
    door.writer.fail = None
    assert await door.post(body, signed(body)) == (200, '{"ok":true}')
    assert len(door.writer.records) == 1


async def test_kafka_that_hangs_is_500_within_the_bound(door: Door) -> None:
    door.writer.hang = True
    body = message()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await door.post(body, signed(body)) == (500, "internal error")
    assert loop.time() - started < 2.0  # bound is 0.3 s here


# --- body limit (Decisions 1) ------------------------------------------------------------------------------


def padded_to(size: int) -> bytes:
    body = message()
    return body[:-1] + b" " * (size - len(body)) + b"}"


async def test_exactly_two_mib_is_accepted(door: Door) -> None:
    body = padded_to(TWO_MIB)
    assert len(body) == TWO_MIB
    assert await door.post(body, signed(body)) == (200, '{"ok":true}')


async def test_one_byte_more_is_413_before_any_other_check(door: Door) -> None:
    body = padded_to(TWO_MIB + 1)
    assert await door.post(body, signed(body)) == (413, "payload too large")
    assert await door.post(body, {}) == (413, "payload too large")  # no timestamp, no signature


async def test_a_refused_body_is_logged_with_its_conversation_and_never_its_content(
    door: Door, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3 MiB HTML e-mail is refused (Decisions 1) and Chatwoot opens its conversation; the log names which."""
    caplog.set_level(logging.INFO)
    body = padded_to(3 * 1024 * 1024)
    assert await door.post(body, signed(body)) == (413, "payload too large")
    lines = [JsonFormatter().format(r) for r in caplog.records if "too large" in r.getMessage()]
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert (line["account_id"], line["conversation_id"], line["event"], line["signed"]) == (
        1,
        42,
        "message_created",
        True,
    )
    assert line["bytes"] == len(body)
    assert "hunter2" not in lines[0] and "jo@example.com" not in lines[0]


async def test_a_refused_body_that_is_not_json_is_logged_without_a_name(
    door: Door, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    body = b"x" * (TWO_MIB + 10)
    assert await door.post(body, {}) == (413, "payload too large")
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if "too large" in r.getMessage()]
    assert len(lines) == 1 and "conversation_id" not in lines[0]


async def test_oversize_chunked_body_without_length_is_413(door: Door) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b" " * (1024 * 1024)

    async with door.session.post(door.url(WEBHOOK_PATH), data=chunks()) as response:
        assert response.status == 413
        assert await response.text() == "payload too large"


async def test_oversize_with_failing_settings_is_still_413() -> None:
    def broken() -> Settings:
        raise ConfigError("CONFIG", "", "gone")

    running, stop = await start_door(broken)
    try:
        assert await running.post(padded_to(TWO_MIB + 1), {}) == (413, "payload too large")
    finally:
        await stop()


# --- other endpoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", WEBHOOK_PATH), ("PUT", WEBHOOK_PATH), ("POST", "/other")])
async def test_other_paths_and_methods_are_404(door: Door, method: str, path: str) -> None:
    async with door.session.request(method, door.url(path)) as response:
        assert response.status == 404
        assert await response.text() == "not found"


async def test_healthz_is_503_while_kafka_cannot_be_written(door: Door) -> None:
    async with door.session.get(door.url("/healthz")) as response:
        assert response.status == 200
        assert await response.json() == {"ok": True, "kafka": True}
    door.writer.fail = ConnectionError("down")
    async with door.session.get(door.url("/healthz")) as response:
        assert response.status == 503  # an orchestrator can see the door cannot make events durable
        assert await response.json() == {"ok": False, "kafka": False}
    door.writer.fail = None
    async with door.session.get(door.url("/healthz")) as response:
        assert (response.status, await response.json()) == (200, {"ok": True, "kafka": True})


async def test_metrics_count_outcomes_and_produce_latency(door: Door) -> None:
    body = message()
    await door.post(body, signed(body))
    await door.post(body, signed(body, secret="guess"))
    async with door.session.get(door.url("/metrics")) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    assert 'chatwoot_router_ingress_requests_total{outcome="accepted"} 1.0' in text
    assert 'chatwoot_router_ingress_requests_total{outcome="bad_signature"} 1.0' in text
    assert "chatwoot_router_ingress_produce_seconds_count 1.0" in text


async def test_logs_never_show_secrets_signatures_or_bodies(door: Door, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    body = message()
    headers = signed(body)
    await door.post(body, headers)
    await door.post(body, signed(body, secret="guess"))
    await door.post(message(account=2), signed(message(account=2)))
    door.writer.fail = ConnectionError("down")
    await door.post(body, headers)
    lines = [JsonFormatter().format(record) for record in caplog.records]
    assert any('"outcome": "accepted"' in line for line in lines)
    text = "\n".join(lines)
    for secret in [
        *SECRETS.values(),
        headers["X-Chatwoot-Signature"][7:],
        "hunter2",
        "jo@example.com",
        "Jo ",
    ]:
        assert secret not in text


# --- fuzz: bad input never gets a 5xx and never becomes a record ------------------------------------------

EVENTS = ["message_created", "message_updated", "conversation_updated", "conversation_status_changed", "x"]
json_values = json_like(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    st.text(max_size=4),
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "event": st.sampled_from(EVENTS) | json_values,
    "account": st.fixed_dictionaries({"id": st.sampled_from([1, 2, 3, 0, "1", None])}) | json_values,
    "id": st.sampled_from([1, 42, 0, -1, None, 1.5]),
    "conversation": st.fixed_dictionaries({"id": st.sampled_from([42, 0, None])}) | json_values,
    "message_type": st.sampled_from(["incoming", "outgoing", 0, 1, None, True]),
    "private": st.sampled_from([True, False, None, 0]),
    "sender": st.none() | st.fixed_dictionaries({}, optional={"type": st.sampled_from(["contact", "user", None])}),
    "updated_at": st.sampled_from([1.5, None, "x"]),
    "changed_attributes": json_values,
}
payloads = st.fixed_dictionaries({}, optional=FIELDS)
one_change = st.sampled_from(sorted(FIELDS)).flatmap(lambda key: FIELDS[key].map(lambda value: {key: value}))
VALID_BASES = [
    json.loads(message()),
    json.loads(message(account=2)),
    {"event": "conversation_status_changed", "account": {"id": 1}, "id": 7, "changed_attributes": None},
]
near_valid = st.builds(lambda base, change: {**base, **change}, st.sampled_from(VALID_BASES), st.just({}) | one_change)
bodies = st.one_of(
    near_valid.map(lambda p: json.dumps(p).encode()),
    near_valid.map(lambda p: json.dumps(p).encode()),
    near_valid.map(lambda p: json.dumps(p).encode()),
    payloads.map(lambda p: json.dumps(p).encode()),
    st.binary(max_size=64),
)
signers = st.sampled_from([SECRETS[1], SECRETS[1], SECRETS[2], "wrong", None])
timestamps = st.sampled_from([NOW_S, NOW_S, "1790000300", "1789999699", "1790000301", "", "abc", None])


def oracle_signer(headers: dict[str, str], body: bytes) -> int | None:
    """Independent check: which configured account's secret produced this exact signature."""
    given = headers.get("X-Chatwoot-Signature", "").lower()
    ts = headers.get("X-Chatwoot-Timestamp", "")
    return next((a for a, s in sorted(SECRETS.items()) if given == sign(s, ts, body)), None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, secret=signers, ts=timestamps, upper=st.booleans(), delivery=st.none() | st.uuids())
async def test_fuzz_never_5xx_and_only_verified_relevant_events_are_written(
    door: Door, body: bytes, secret: str | None, ts: str | None, upper: bool, delivery: Any
) -> None:
    door.writer.records.clear()
    headers: dict[str, str] = {}
    if ts is not None:
        headers["X-Chatwoot-Timestamp"] = ts
    if secret is not None:
        signature = sign(secret, ts or "", body)
        headers["X-Chatwoot-Signature"] = signature.upper() if upper else signature
    if delivery is not None:
        headers["X-Chatwoot-Delivery"] = str(delivery)
    status, text = await door.post(body, headers)
    assert status < 500
    if not door.writer.records:
        return
    assert (status, text) == (200, '{"ok":true}')
    (record,) = door.writer.records
    assert ts is not None and abs(int(ts) - int(NOW_S)) <= 300
    payload = json.loads(body)
    assert oracle_signer(headers, body) == payload["account"]["id"] == record.account_id
    assert payload["event"] in ("message_created", "conversation_updated", "conversation_status_changed")
    assert record.delivery_id == (str(delivery) if delivery is not None else None)


async def test_configuration_file_changes_are_picked_up_without_restart(tmp_path: Any) -> None:
    config = tmp_path / "router.json"
    config.write_text(json.dumps(CONFIG), encoding="utf-8")
    env = {
        "CHATWOOT_TOKEN": "u",
        "CHATWOOT_AGENT_BOT_TOKENS": '{"1":"a","2":"b"}',
        "CHATWOOT_AGENT_BOT_SECRETS": json.dumps({str(k): v for k, v in SECRETS.items()}),
        "TYPESAFE_API_KEY": "k",
    }
    running, stop = await start_door(SettingsFile(str(config), environ=env))
    try:
        body = message()
        assert await running.post(body, signed(body)) == (200, '{"ok":true}')
        config.write_text('{"chatwoot": {}}', encoding="utf-8")
        async with running.session.get(running.url("/healthz")) as response:
            assert (response.status, await response.json()) == (503, {"ok": False, "kafka": True})
        assert await running.post(body, signed(body)) == (500, "internal error")
    finally:
        await stop()
