"""Configuration documents on `<app>.configs` (DESIGN §8 "Configuration is an event").

A document is everything the folds depend on besides the events: the routing configuration (behavior.md §2.2,
no secrets: the folds never see any) and the fold settings. Its version is a hash of its content, so applying
the same file twice gives the same version.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

from schemas.config import RouterConfig

DEFAULT_RETRY_BASE_MS = 5000


class FoldSettings(BaseModel):
    """Settings of the folds that are not in the configuration file (they came from the environment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retry_base_ms: int = Field(default=DEFAULT_RETRY_BASE_MS, ge=1)


class ConfigDocument(BaseModel):
    """One applied configuration: the record value on `<app>.configs`, keyed by `version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    config: RouterConfig
    fold: FoldSettings = FoldSettings()
    applied_at_ms: int = 0

    @classmethod
    def of(cls, config: RouterConfig, fold: FoldSettings, applied_at_ms: int = 0) -> ConfigDocument:
        return cls(version=config_version(config, fold), config=config, fold=fold, applied_at_ms=applied_at_ms)


def config_version(config: RouterConfig, fold: FoldSettings) -> str:
    """A short content hash: equal documents, equal versions, wherever and whenever they are applied."""
    body = {"config": config.model_dump(mode="json", by_alias=True), "fold": fold.model_dump(mode="json")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ConfigBook:
    """The documents applied so far, in the order they were applied (the `configs` topic's offsets).

    `first` is in force for a partition's records before its first marker (the log of a deployment that ran
    before configurations were events, or records written before the first worker applied its file).
    """

    def __init__(self, documents: list[ConfigDocument] | None = None) -> None:
        self._by_version: dict[str, ConfigDocument] = {}
        self._first: str | None = None
        self._latest: str | None = None
        for document in documents or []:
            self.add(document)

    def add(self, document: ConfigDocument) -> None:
        """Record `document` as the latest applied (re-applying an older version makes it the latest again)."""
        self._by_version[document.version] = document
        self._first = self._first or document.version
        self._latest = document.version

    def documents(self) -> list[ConfigDocument]:
        return list(self._by_version.values())

    def __contains__(self, version: object) -> bool:
        return version in self._by_version

    def __len__(self) -> int:
        return len(self._by_version)

    def get(self, version: str) -> ConfigDocument:
        return self._by_version[version]

    @property
    def first(self) -> ConfigDocument | None:
        return self._by_version[self._first] if self._first is not None else None

    @property
    def latest(self) -> ConfigDocument | None:
        return self._by_version[self._latest] if self._latest is not None else None

    def in_force(self, version: str | None) -> ConfigDocument | None:
        """The document for a partition whose last marker named `version` (None: no marker yet)."""
        if version is not None and version in self._by_version:
            return self._by_version[version]
        return self.first
