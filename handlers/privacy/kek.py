"""The operator's key-encryption key (issue 32), from the environment: never logged, never in an error.

- `ROUTER_KEY_ENCRYPTION_KEY`: 32 random bytes, base64 (standard or URL-safe), e.g. `openssl rand -base64 32`;
  or `ROUTER_KEY_ENCRYPTION_KEY_FILE`: a file holding that value (a mounted secret). Not both.
- `ROUTER_KEY_ENCRYPTION_KEYS_RETIRED` (or `..._FILE`): earlier keys, comma- or line-separated, still accepted to
  unwrap data keys while `chatwoot-router keys rotate` rewraps them under the current one (docs/privacy.md).

Every wrapped data key names the KEK that wrapped it (`kek_id`, a hash of the key, not the key), so a reader
picks the right one and a missing one is named by its id.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from handlers.privacy.envelope import KEY_BYTES, CannotOpen, DataKey, KeyEncryptionKey
from schemas.config import ConfigError

KEK_VAR = "ROUTER_KEY_ENCRYPTION_KEY"
RETIRED_VAR = "ROUTER_KEY_ENCRYPTION_KEYS_RETIRED"


class UnknownKek(Exception):
    """A data key wrapped by a KEK this process was not given."""

    def __init__(self, kek_id: str) -> None:
        super().__init__(f"data key wrapped by key-encryption key {kek_id}, which this process does not have")
        self.kek_id = kek_id


def _decode(value: str, name: str) -> KeyEncryptionKey:
    text = value.strip()
    try:
        standard = text.replace("-", "+").replace("_", "/")  # URL-safe base64 too
        raw = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("environment", name, "is not base64 (expected 32 random bytes, base64)") from None
    if len(raw) != KEY_BYTES:
        raise ConfigError("environment", name, f"holds {len(raw)} bytes, expected {KEY_BYTES}")
    return KeyEncryptionKey(raw)


def _value(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """The variable's value, or its `_FILE`'s content, with the name to report; None when neither is set."""
    direct, file = env.get(name), env.get(f"{name}_FILE")
    if direct and file:
        raise ConfigError("environment", name, f"set both {name} and {name}_FILE; set one")
    if direct:
        return direct, name
    if file:
        try:
            return Path(file).read_text(), f"{name}_FILE"
        except OSError as exc:
            raise ConfigError("environment", f"{name}_FILE", f"cannot be read ({type(exc).__name__})") from None
    return None


@dataclass(frozen=True)
class KeyEncryptionKeys:
    """The current KEK (wraps new data keys) and the retired ones (unwrap only)."""

    current: KeyEncryptionKey
    retired: tuple[KeyEncryptionKey, ...] = ()

    def by_id(self, kek_id: str) -> KeyEncryptionKey:
        for kek in (self.current, *self.retired):
            if kek.kek_id == kek_id:
                return kek
        raise UnknownKek(kek_id)

    def unwrap(self, kek_id: str, wrapped: str, conversation: str) -> DataKey:
        return self.by_id(kek_id).unwrap(wrapped, conversation)


def load_keks(env: Mapping[str, str] | None = None) -> KeyEncryptionKeys | None:
    """The KEKs the environment gives, or None when it gives none (a reader then shows personal fields as
    withheld; a worker refuses to start). Bad values: `ConfigError` naming the variable, never its value."""
    env = os.environ if env is None else env
    found = _value(env, KEK_VAR)
    retired_found = _value(env, RETIRED_VAR)
    if found is None:
        if retired_found is not None:
            raise ConfigError("environment", RETIRED_VAR, f"is set without {KEK_VAR}")
        return None
    current = _decode(*found)
    retired: list[KeyEncryptionKey] = []
    if retired_found is not None:
        text, name = retired_found
        for part in text.replace("\n", ",").split(","):
            if part.strip():
                retired.append(_decode(part, name))
    return KeyEncryptionKeys(current, tuple(retired))


def require_keks(env: Mapping[str, str] | None = None) -> KeyEncryptionKeys:
    """The KEKs of a process that seals (the worker): refusing to start without one, in one line."""
    keks = load_keks(env)
    if keks is None:
        raise ConfigError(
            "environment",
            KEK_VAR,
            f"is not set (nor {KEK_VAR}_FILE): the worker seals customer text under it; see docs/privacy.md",
        )
    return keks


def new_kek_value() -> str:
    """A fresh KEK as the variable takes it (the demo and the tests make their own)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


__all__ = [
    "KEK_VAR",
    "RETIRED_VAR",
    "CannotOpen",
    "KeyEncryptionKeys",
    "UnknownKek",
    "load_keks",
    "new_kek_value",
    "require_keks",
]
