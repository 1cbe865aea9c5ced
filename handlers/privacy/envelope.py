"""The sealing of personal fields (issue 32): AES-256-GCM under a data key per conversation, and data keys wrapped
by the operator's key-encryption key (KEK).

A sealed field is `s1.<base64url(nonce | ciphertext | tag)>`, bound by its associated data to the conversation and
the field it belongs to, so a sealed value copied into another conversation or field does not open. Beside each
sealed text the record keeps a *digest* (HMAC-SHA-256 under a key derived from the same data key): the fold
compares inputs and names decision memos by digests, never by plaintext, and once the data key is destroyed no
one can check a guessed text against a digest either.

Nonces are random (96 bits): a conversation's data key seals a few hundred fields in its life, far below GCM's
limit for random nonces.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEALED_PREFIX = "s1."
WRAPPED_PREFIX = "w1."
KEY_BYTES = 32
NONCE_BYTES = 12
DIGEST_HEX = 32


class CannotOpen(Exception):
    """A sealed value that does not open under the key given: another conversation's, altered, or not sealed."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose).derive(key)


@dataclass(frozen=True)
class DataKey:
    """One conversation's data key, with the two keys derived from it (sealing, digests)."""

    conversation: str
    material: bytes = field(repr=False)
    _aead: AESGCM = field(init=False, repr=False, compare=False)
    _mac: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_aead", AESGCM(_derive(self.material, b"chatwoot-router seal v1")))
        object.__setattr__(self, "_mac", _derive(self.material, b"chatwoot-router digest v1"))

    @classmethod
    def new(cls, conversation: str) -> DataKey:
        return cls(conversation, os.urandom(KEY_BYTES))

    def _context(self, what: str) -> bytes:
        return f"{self.conversation}|{what}".encode()

    def seal(self, plaintext: str, what: str) -> str:
        """`plaintext` sealed for field `what` of this conversation."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), self._context(what))
        return SEALED_PREFIX + _b64(nonce + sealed)

    def open(self, sealed: str, what: str) -> str:
        """The plaintext of a value `seal` made for field `what` of this conversation; `CannotOpen` otherwise."""
        if not sealed.startswith(SEALED_PREFIX):
            raise CannotOpen("not a sealed value")
        try:
            raw = _unb64(sealed[len(SEALED_PREFIX) :])
            plain = self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], self._context(what))
        except (InvalidTag, ValueError) as exc:
            raise CannotOpen(type(exc).__name__) from None
        return plain.decode()

    def digest(self, plaintext: str, what: str) -> str:
        """A keyed digest of `plaintext` for field `what`: equal texts, equal digests, within this conversation."""
        mac = hmac.new(self._mac, self._context(what) + b"\0" + plaintext.encode(), hashlib.sha256)
        return mac.hexdigest()[:DIGEST_HEX]


@dataclass(frozen=True)
class KeyEncryptionKey:
    """The operator's secret that wraps every data key; `kek_id` names it in each wrapped key (for rotation)."""

    material: bytes = field(repr=False)

    @property
    def kek_id(self) -> str:
        return hashlib.sha256(b"chatwoot-router kek id|" + self.material).hexdigest()[:12]

    def wrap(self, key: DataKey) -> str:
        """`key` sealed under this KEK, bound to its conversation."""
        nonce = os.urandom(NONCE_BYTES)
        aad = f"data-key|{key.conversation}".encode()
        return WRAPPED_PREFIX + _b64(nonce + AESGCM(self.material).encrypt(nonce, key.material, aad))

    def unwrap(self, wrapped: str, conversation: str) -> DataKey:
        """The data key `wrap` sealed for `conversation`; `CannotOpen` otherwise."""
        if not wrapped.startswith(WRAPPED_PREFIX):
            raise CannotOpen("not a wrapped key")
        try:
            raw = _unb64(wrapped[len(WRAPPED_PREFIX) :])
            aad = f"data-key|{conversation}".encode()
            material = AESGCM(self.material).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
        except (InvalidTag, ValueError) as exc:
            raise CannotOpen(type(exc).__name__) from None
        return DataKey(conversation, material)

    def __repr__(self) -> str:  # never the material
        return f"KeyEncryptionKey(kek_id={self.kek_id!r})"
