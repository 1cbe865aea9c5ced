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

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_ENDPOINT = "https://api.typesafe.ai/v1/systemone"
DEFAULT_MODEL = "jev-1.13.0"

_ACCOUNT_KEY = re.compile(r"^[1-9][0-9]*$")
_OWNER_NAME = re.compile(r"^[a-z0-9_]{1,40}$")
_KIND_NAME = re.compile(r"^[a-z0-9_-]{1,40}$")
_TOPIC_NAME = re.compile(r"^[a-z0-9_-]{1,255}$")


class ConfigError(ValueError):
    """An invalid configuration or secret; `str()` is safe to print (no secret values)."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        super().__init__(f"Invalid {source}: {path}: {reason}" if path else f"Invalid {source}: {reason}")


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


def load_config_file(path: str | Path) -> RouterConfig:
    """Read a JSON or YAML configuration file (Decisions 8)."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("CONFIG", "", f"cannot read {path}: {exc.strerror}") from None
    try:
        document = yaml.safe_load(raw)  # YAML is a superset of JSON
    except yaml.YAMLError:
        raise ConfigError("CONFIG", "", f"{path} is neither JSON nor YAML") from None
    return parse_config(document)


def _account_map(name: str, raw: str | None, routed: set[int]) -> dict[int, str]:
    fail = ConfigError("secrets", name, "needs exactly the routed accounts")
    if raw is None:
        raise fail
    try:
        parsed = json.loads(raw)
    except ValueError:
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
    return result


def parse_secrets(environ: Mapping[str, str], config: RouterConfig) -> Secrets:
    """Read the four secrets of behavior.md §2.3 from an environment mapping."""
    routed = set(config.routing.accounts)
    for name in ("CHATWOOT_TOKEN", "TYPESAFE_API_KEY"):
        if not environ.get(name, "").strip():
            raise ConfigError("secrets", name, "must be set and non-empty")
    return Secrets(
        chatwoot_token=environ["CHATWOOT_TOKEN"],
        agent_bot_tokens=_account_map(
            "CHATWOOT_AGENT_BOT_TOKENS", environ.get("CHATWOOT_AGENT_BOT_TOKENS"), routed
        ),
        agent_bot_secrets=_account_map(
            "CHATWOOT_AGENT_BOT_SECRETS", environ.get("CHATWOOT_AGENT_BOT_SECRETS"), routed
        ),
        typesafe_api_key=environ["TYPESAFE_API_KEY"],
    )


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load configuration (from `path` or ROUTER_CONFIG) and secrets, validated together."""
    env = os.environ if environ is None else environ
    source = path or env.get("ROUTER_CONFIG")
    if not source:
        raise ConfigError("CONFIG", "", "no configuration file: pass --config or set ROUTER_CONFIG")
    config = load_config_file(source)
    return Settings(config=config, secrets=parse_secrets(env, config))
