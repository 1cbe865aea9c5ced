"""Routing configuration and secrets (behavior.md §2), validated together.

The document keeps the earlier router's camelCase keys so its configurations carry over unchanged; every
object is strict (unknown keys are errors) and every error names its key path, never a secret's value.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from schemas.kafka_security import PROPERTIES_VARIABLE, properties_bootstrap

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_ENDPOINT = "https://api.typesafe.ai/v1/systemone"
DEFAULT_MODEL = "jev-1.13.0"

_ACCOUNT_KEY = re.compile(r"^[1-9][0-9]*$")
_OWNER_NAME = re.compile(r"^[a-z0-9_]{1,40}$")
_KIND_NAME = re.compile(r"^[a-z0-9_-]{1,40}$")
_TOPIC_NAME = re.compile(r"^[a-z0-9_-]{1,255}$")


class ConfigError(ValueError):
    """An invalid configuration, secret or environment variable.

    `str()` is one printable line, safe to print: no secret values, control characters and lone surrogates
    escaped, overlong key names shortened.
    """

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = _printable(path, 160)
        self.reason = _printable(reason, 400)
        text = f"Invalid {source}: {self.path}: {self.reason}" if path else f"Invalid {source}: {self.reason}"
        super().__init__(text)


def _printable(text: str, limit: int) -> str:
    """`text` as one line of printable characters (others escaped), at most about `limit` characters."""
    if text.isprintable() and len(text) <= limit:
        return text
    escaped = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as JavaScript measures strings."""
    return len(text.encode("utf-16-le")) // 2


def _text(min_len: int, max_len: int) -> Any:
    def check(value: str) -> str:
        n = utf16_len(value)
        if n < min_len or n > max_len:
            raise ValueError(f"must be {min_len}-{max_len} characters long")
        return value

    return AfterValidator(check)


def _account_key(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _ACCOUNT_KEY.match(value) or int(value) > MAX_SAFE_INTEGER:
        raise ValueError("account ids are positive integers written as strings")
    return int(value)


def _name(pattern: re.Pattern[str], reserved: str) -> Any:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"must match {pattern.pattern}")
        if value == reserved:
            raise ValueError(f"{reserved!r} is reserved")
        return value

    return AfterValidator(check)


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(*, https_only: bool) -> Any:
    def check(value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL")
        if https_only and parts.scheme != "https" and not _is_loopback(parts.hostname):
            raise ValueError("must be an https URL (http only for loopback hosts)")
        return value

    return AfterValidator(check)


AccountId = Annotated[int, BeforeValidator(_account_key)]
PositiveSafeInt = Annotated[int, Field(strict=True, gt=0, le=MAX_SAFE_INTEGER)]
Criterion = Annotated[str, Field(strict=True), _text(1, 1000)]


def _trim(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Owner(_Strict):
    assignee: PositiveSafeInt
    covers: Criterion


class Kind(_Strict):
    covers: Criterion
    canned_response: Annotated[str | None, BeforeValidator(_trim), _text(1, 255)] | None = Field(
        default=None, alias="cannedResponse"
    )
    status: Literal["resolved", "snoozed"] | None = None
    label: bool = True


OwnerName = Annotated[str, _name(_OWNER_NAME, "unclear")]
KindName = Annotated[str, _name(_KIND_NAME, "none")]
TopicName = Annotated[str, _name(_TOPIC_NAME, "")]


class ChatwootSettings(_Strict):
    base_url: Annotated[str, _url(https_only=False)] = Field(alias="baseUrl")

    @property
    def api_base(self) -> str:
        """The base URL with trailing slashes removed, ready for paths to be appended."""
        return self.base_url.rstrip("/")


class Routing(_Strict):
    endpoint: Annotated[str, _url(https_only=True)] = DEFAULT_ENDPOINT
    model: Annotated[str, Field(min_length=1)] = DEFAULT_MODEL
    min_confidence: Annotated[float, Field(ge=0.5, le=1)] = Field(default=0.7, alias="minConfidence")
    bot_ids: dict[AccountId, PositiveSafeInt] = Field(alias="botIds")
    accounts: dict[AccountId, dict[OwnerName, Owner]]
    topics: dict[TopicName, Criterion] | None = None
    kinds: dict[AccountId, dict[KindName, Kind]] | None = None

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Routing:
        if not self.accounts:
            raise _PathError("accounts", "needs at least one routed account")
        for account, owners in self.accounts.items():
            if not owners:
                raise _PathError(f"accounts.{account}", "needs at least one owner")
        if set(self.bot_ids) != set(self.accounts):
            raise _PathError("botIds", "needs exactly the routed accounts")
        for account, kinds in (self.kinds or {}).items():
            if account not in self.accounts:
                raise _PathError("kinds", f"account {account} is not routed")
            clash = sorted(set(kinds) & set(self.topics or {}))
            if clash:
                raise _PathError("kinds", f"kind names must not be topic names: {', '.join(clash)}")
        return self


class _PathError(ValueError):
    """A cross-field rule violation that knows the key path it concerns (relative to `routing`)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(reason)


class RouterConfig(_Strict):
    """The routing configuration document (behavior.md §2.2)."""

    chatwoot: ChatwootSettings
    subrequest_budget: Annotated[int, Field(ge=45, le=1000)] = Field(default=45, alias="subrequestBudget")
    routing: Routing

    def is_routed(self, account_id: int) -> bool:
        return account_id in self.routing.accounts

    def kinds_of(self, account_id: int) -> dict[str, Kind] | None:
        """The account's kinds, or None when the account gets no kind question."""
        if self.routing.kinds is None:
            return None
        return self.routing.kinds.get(account_id)


class Secrets(BaseModel):
    """Secrets from the environment (behavior.md §2.3). `repr` never shows values."""

    model_config = ConfigDict(frozen=True)

    chatwoot_token: str = Field(repr=False)
    agent_bot_tokens: dict[int, str] = Field(repr=False)
    agent_bot_secrets: dict[int, str] = Field(repr=False)
    typesafe_api_key: str = Field(repr=False)


class Settings(BaseModel):
    """Configuration and secrets, validated together."""

    model_config = ConfigDict(frozen=True)

    config: RouterConfig
    secrets: Secrets


SECRET_NAMES = (
    "CHATWOOT_TOKEN",
    "CHATWOOT_AGENT_BOT_TOKENS",
    "CHATWOOT_AGENT_BOT_SECRETS",
    "TYPESAFE_API_KEY",
)


def _loc_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc if part != "[key]" and not str(part).startswith("function-"))


def parse_config(document: Any) -> RouterConfig:
    """Validate a parsed configuration document, raising ConfigError with the first offending key path."""
    try:
        return RouterConfig.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        ctx_error = (first.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _PathError):
            raise ConfigError("CONFIG", f"routing.{ctx_error.path}", str(ctx_error)) from None
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError("CONFIG", _loc_path(first["loc"]), message) from None


MAX_CONFIG_BYTES = 16 * 1024 * 1024
"""Largest configuration file read (a real one is a few kilobytes)."""
MAX_CONFIG_DEPTH = 32
"""Deepest nesting of mappings and lists accepted (the schema itself is five levels deep)."""


def load_config_file(path: str | Path) -> RouterConfig:
    """Read a JSON or YAML configuration file (Decisions 8); every failure is a one-line ConfigError."""
    return parse_config(read_config_document(path))


def read_config_document(path: str | Path) -> Any:
    """The parsed document of a configuration file: UTF-8 text, JSON or YAML, at most MAX_CONFIG_DEPTH deep,
    no lone surrogates in any string. Syntax errors name the line and column."""
    name = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError("CONFIG", "", f"cannot read {name}: {exc.strerror or type(exc).__name__}") from None
    except ValueError:  # e.g. an embedded NUL in the name
        raise ConfigError("CONFIG", "", f"cannot read {name}: not a usable file name") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("CONFIG", name, f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = _line_column(data, exc.start)
        raise ConfigError("CONFIG", name, f"line {line}, column {column}: not UTF-8 text") from None
    document = _parse_text(name, text)
    _check_document(document)
    return document


def _line_column(data: bytes, offset: int) -> tuple[int, int]:
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1


def _parse_text(name: str, text: str) -> Any:
    """JSON when the text looks like JSON (so tabs and JSON's own error positions work), else YAML."""
    json_error: json.JSONDecodeError | None = None
    if text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text, parse_constant=_reject_json_constant)
        except json.JSONDecodeError as exc:
            json_error = exc  # maybe a YAML flow mapping; YAML decides, JSON's error is reported
        except RecursionError:
            raise ConfigError("CONFIG", name, f"nested more than {MAX_CONFIG_DEPTH} levels deep") from None
        except ValueError as exc:
            raise ConfigError("CONFIG", name, str(exc)) from None
    try:
        _check_yaml_depth(text)
        return yaml.safe_load(text)  # YAML is a superset of JSON
    except _TooDeep as exc:
        raise ConfigError(
            "CONFIG", name, f"line {exc.line}, column {exc.column}: nested more than {MAX_CONFIG_DEPTH} levels deep"
        ) from None
    except RecursionError:
        raise ConfigError("CONFIG", name, f"nested more than {MAX_CONFIG_DEPTH} levels deep") from None
    except yaml.YAMLError as exc:
        if json_error is not None:
            raise ConfigError(
                "CONFIG", name, f"line {json_error.lineno}, column {json_error.colno}: {json_error.msg}"
            ) from None
        raise ConfigError("CONFIG", name, _yaml_problem(exc)) from None


def _reject_json_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class _TooDeep(Exception):
    def __init__(self, line: int, column: int) -> None:
        self.line, self.column = line, column


def _check_yaml_depth(text: str) -> None:
    """Walk YAML's event stream (iterative, unlike its composer) and stop at the first over-deep node."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                mark = event.start_mark
                raise _TooDeep(mark.line + 1 if mark else 0, mark.column + 1 if mark else 0)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`line L, column C: problem` from a YAML error, without quoting the file's text."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "not valid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return problem
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character at position {exc.position} is not allowed in YAML"
    return "not valid JSON or YAML"


def _check_document(document: Any) -> None:
    """Depth and text checks over the parsed document, iteratively (no recursion on hostile input)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_CONFIG_DEPTH:
            raise ConfigError("CONFIG", ".".join(path[:4]) + ".…", f"nested more than {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise ConfigError("CONFIG", ".".join(path), "not Unicode text (a lone surrogate)")
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    raise ConfigError("CONFIG", ".".join(path), "a key is not Unicode text (a lone surrogate)")
                stack.append((value, (*path, str(key))))
        elif isinstance(node, list):
            stack.extend((value, (*path, str(index))) for index, value in enumerate(node))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _usable_secret(value: str) -> bool:
    """Text that can go into an HTTP header or an HMAC key: no lone surrogates, no control characters."""
    return value.isprintable() and not _SURROGATE.search(value)


def _account_map(name: str, raw: str | None, routed: set[int]) -> dict[int, str]:
    fail = ConfigError("secrets", name, "needs exactly the routed accounts")
    if raw is None:
        raise fail
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        raise ConfigError("secrets", name, "must be a JSON object of strings") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ConfigError("secrets", name, "must be a JSON object of strings")
    result: dict[int, str] = {}
    for key, value in parsed.items():
        try:
            result[_account_key(key)] = value
        except ValueError:
            raise fail from None
    if len(parsed) != len(routed) or any(not result.get(a, "").strip() for a in routed):
        raise fail
    if not all(_usable_secret(value) for value in result.values()):
        raise ConfigError("secrets", name, "values must be printable text (no control characters)")
    return result


def parse_secrets(environ: Mapping[str, str], config: RouterConfig) -> Secrets:
    """Read the four secrets of behavior.md §2.3 from an environment mapping."""
    routed = set(config.routing.accounts)
    for name in ("CHATWOOT_TOKEN", "TYPESAFE_API_KEY"):
        if not (environ.get(name) or "").strip():
            raise ConfigError("secrets", name, "must be set and non-empty")
        if not _usable_secret(environ[name]):
            raise ConfigError("secrets", name, "must be printable text (no control characters)")
    return Secrets(
        chatwoot_token=environ["CHATWOOT_TOKEN"],
        agent_bot_tokens=_account_map("CHATWOOT_AGENT_BOT_TOKENS", environ.get("CHATWOOT_AGENT_BOT_TOKENS"), routed),
        agent_bot_secrets=_account_map("CHATWOOT_AGENT_BOT_SECRETS", environ.get("CHATWOOT_AGENT_BOT_SECRETS"), routed),
        typesafe_api_key=environ["TYPESAFE_API_KEY"],
    )


# --- the process environment ---------------------------------------------------------------------------

DEFAULT_APP_ID = "chatwoot-router"
DEFAULT_BOOTSTRAP = "localhost:9092"
_APP_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")  # Kafka's legal topic characters; room for suffixes
_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII only: str.isdigit() also says yes to "²" and "٣"
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?|\.[0-9]{1,9}")


def _env_int(low: int, high: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, str):
            value = value.strip()
            if not _DIGITS.fullmatch(value):
                raise ValueError(f"must be a whole number from {low} to {high} (ASCII digits)")
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be a whole number from {low} to {high} (ASCII digits)")
        return value

    return BeforeValidator(check)


def _env_seconds(low_exclusive: float, high: float, unit: str = "seconds") -> Any:
    def check(value: Any) -> float:
        if isinstance(value, str):
            value = value.strip()
            if not _DECIMAL.fullmatch(value):
                raise ValueError(f"must be a number of {unit} above {low_exclusive:g} and at most {high:g}")
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low_exclusive < value <= high:
            raise ValueError(f"must be a number of {unit} above {low_exclusive:g} and at most {high:g}")
        return float(value)

    return BeforeValidator(check)


def _app_id(value: str) -> str:
    value = value.strip()
    if not _APP_ID.fullmatch(value):
        raise ValueError("must be 1-120 characters of A-Z, a-z, 0-9, '.', '_' and '-' (it prefixes topic names)")
    return value


def _chatwoot_version(value: str) -> str:
    value = value.strip()
    if not re.fullmatch(r"v?\d{1,3}\.\d{1,3}(\.\d{1,3})?", value):
        raise ValueError("must be a Chatwoot version such as 4.17.2")
    return value


def _bootstrap(value: str) -> str:
    from aiokafka.conn import collect_hosts

    value = value.strip()
    problem = "must be host:port[,host:port…] in printable ASCII"
    if not value.isascii() or not value.isprintable() or " " in value:
        raise ValueError(problem)
    try:
        hosts = collect_hosts(value, randomize=False)
    except Exception:
        raise ValueError(problem) from None
    if not hosts or any(not host or not 0 < port < 65536 for host, port, _ in hosts):
        raise ValueError(problem)
    return value


def _config_path(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must be a file name")
    return value


class RouterEnv(BaseModel):
    """Every environment variable the router reads (DESIGN §3), validated once, the same way by every command.

    An empty or blank variable counts as unset (its default applies). Secrets are kept as given here and
    validated against the configuration by `parse_secrets`; `repr` never shows them.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    bootstrap: Annotated[str, AfterValidator(_bootstrap)] = Field(DEFAULT_BOOTSTRAP, alias="KAFKA_BOOTSTRAP_SERVERS")
    config_path: Annotated[str, AfterValidator(_config_path)] | None = Field(None, alias="ROUTER_CONFIG")
    app_id: Annotated[str, AfterValidator(_app_id)] = Field(DEFAULT_APP_ID, alias="ROUTER_APP_ID")
    partitions: Annotated[int, _env_int(1, 10_000)] = Field(12, alias="ROUTER_PARTITIONS")
    data_dir: Path = Field(Path("data"), alias="ROUTER_DATA_DIR")
    retry_base_ms: Annotated[int, _env_int(1, 3_600_000)] = Field(5000, alias="ROUTER_RETRY_BASE_MS")
    sweep_interval_s: Annotated[float, _env_seconds(0, 7 * 86_400)] = Field(300.0, alias="ROUTER_SWEEP_INTERVAL_S")
    produce_timeout_ms: Annotated[int, _env_int(1, 60_000)] = Field(1000, alias="ROUTER_PRODUCE_TIMEOUT_MS")
    read_timeout_s: Annotated[float, _env_seconds(0, 3600)] = Field(10.0, alias="ROUTER_READ_TIMEOUT_S")
    keepalive_timeout_s: Annotated[float, _env_seconds(0, 3600)] = Field(15.0, alias="ROUTER_KEEPALIVE_TIMEOUT_S")
    max_connections: Annotated[int, _env_int(1, 1_000_000)] = Field(512, alias="ROUTER_MAX_CONNECTIONS")
    # a finite retention of the event log (conversations, sweeps) chosen by the operator; unset: kept forever
    log_retention_ms: Annotated[int, _env_int(3_600_000, 315_360_000_000)] | None = Field(
        None, alias="ROUTER_LOG_RETENTION_MS"
    )
    # the erasure deadline (issue 32): `max.compaction.lag.ms` of `<app>.keys`, by when compaction has removed a
    # forgotten conversation's old data key from every broker (projections/topic_settings.py); 1 s to 30 days
    erasure_deadline_ms: Annotated[int, _env_int(1_000, 2_592_000_000)] = Field(
        604_800_000, alias="ROUTER_ERASURE_DEADLINE_MS"
    )
    # issue 32: customer text is erased this many days after the last text sealed for its conversation (its last
    # turn), the decisions kept (handlers/privacy/retention.py); unset: kept until `forget`
    text_retention_days: Annotated[float, _env_seconds(0, 36_500, "days")] | None = Field(
        None, alias="ROUTER_TEXT_RETENTION_DAYS"
    )
    # how old the fresh read a mutation depends on may be when a worker makes the mutation (DESIGN §6)
    fresh_read_ms: Annotated[int, _env_int(100, 600_000)] = Field(5000, alias="ROUTER_FRESH_READ_MS")
    # how long a worker reuses an inbox's bot link and an account's agents it read (administrators' settings, not
    # conversation state), never longer than ROUTER_FRESH_READ_MS; 0 reads them every time (issue 40)
    settings_reuse_ms: Annotated[int, _env_int(0, 600_000)] = Field(5000, alias="ROUTER_SETTINGS_REUSE_MS")
    # how often a worker writes its write cache and commits its offsets (Kafka Streams' commit.interval.ms): it
    # bounds the records folded again after a crash; no turn waits for it (docs/architecture.md "The commit protocol")
    commit_interval_ms: Annotated[int, _env_int(100, 60_000)] = Field(2800, alias="ROUTER_COMMIT_INTERVAL_MS")
    # a stable name per worker (e.g. the pod's): static group membership, so a restarted worker takes its
    # partitions back at once instead of the whole group waiting out the dead member's session
    worker_id: Annotated[str, AfterValidator(_app_id)] | None = Field(None, alias="ROUTER_WORKER_ID")
    # the Chatwoot version, when a proxy hides GET /api (handlers/worker/chatwoot_gate.py); unset: asked of Chatwoot
    chatwoot_version: Annotated[str, AfterValidator(_chatwoot_version)] | None = Field(
        None, alias="ROUTER_CHATWOOT_VERSION"
    )
    # the requests a minute the workers together make to Chatwoot, below its per-IP limit (RACK_ATTACK_LIMIT,
    # 3,000 by default); each worker takes its share of the partitions (handlers/clients/budget.py)
    chatwoot_requests_per_min: Annotated[int, _env_int(10, 1_000_000)] = Field(
        2400, alias="ROUTER_CHATWOOT_REQUESTS_PER_MIN"
    )
    chatwoot_token: str | None = Field(None, alias="CHATWOOT_TOKEN", repr=False)
    agent_bot_tokens: str | None = Field(None, alias="CHATWOOT_AGENT_BOT_TOKENS", repr=False)
    agent_bot_secrets: str | None = Field(None, alias="CHATWOOT_AGENT_BOT_SECRETS", repr=False)
    typesafe_api_key: str | None = Field(None, alias="TYPESAFE_API_KEY", repr=False)

    def topic(self, name: str) -> str:
        """`<app>.<name>`: conversations, effects, sweeps, dlq."""
        return f"{self.app_id}.{name}"

    def secret_environ(self) -> dict[str, str]:
        """The secrets by their variable names (only those set), for `parse_secrets`."""
        values = {
            "CHATWOOT_TOKEN": self.chatwoot_token,
            "CHATWOOT_AGENT_BOT_TOKENS": self.agent_bot_tokens,
            "CHATWOOT_AGENT_BOT_SECRETS": self.agent_bot_secrets,
            "TYPESAFE_API_KEY": self.typesafe_api_key,
        }
        return {name: value for name, value in values.items() if value is not None}


ENV_NAMES = tuple(field.alias for field in RouterEnv.model_fields.values() if field.alias)


def read_env(environ: Mapping[str, str] | None = None) -> RouterEnv:
    """Read and validate the environment (os.environ by default); a bad variable is a ConfigError naming it."""
    env = os.environ if environ is None else environ
    present = {name: value for name in ENV_NAMES if (value := env.get(name)) is not None and value.strip()}
    # unset KAFKA_BOOTSTRAP_SERVERS: the bootstrap.servers of KAFKA_CLIENT_PROPERTIES, as a Java client reads it
    listed = None if "KAFKA_BOOTSTRAP_SERVERS" in present else properties_bootstrap(env)
    if listed is not None:
        present["KAFKA_BOOTSTRAP_SERVERS"] = listed
    try:
        return RouterEnv.model_validate(present)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "environment"
        message = first["msg"].removeprefix("Value error, ")
        if listed is not None and name == "KAFKA_BOOTSTRAP_SERVERS":
            source = f"Kafka client properties ({env.get(PROPERTIES_VARIABLE, '').strip()})"
            raise ConfigError(source, "bootstrap.servers", message) from None
        raise ConfigError("environment", name, message) from None


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | RouterEnv | None = None) -> Settings:
    """Load configuration (from `path` or ROUTER_CONFIG) and secrets, validated together with the environment."""
    env = environ if isinstance(environ, RouterEnv) else read_env(environ)
    source = path or env.config_path
    if not source:
        raise ConfigError("CONFIG", "", "no configuration file: pass --config or set ROUTER_CONFIG")
    config = load_config_file(source)
    return Settings(config=config, secrets=parse_secrets(env.secret_environ(), config))
