"""Configuration versions (DESIGN §8): content-hashed documents, and replays that switch at the markers."""

from __future__ import annotations

from projections.logs.audit import LogReplay
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings, config_version
from schemas.records import ConfigApplied, WebhookReceived, parse_marker
from tests.unit.test_fold_driver import ACCOUNT, CONV, T0, make_config


def test_the_version_is_a_hash_of_the_content_so_the_same_file_gives_the_same_version() -> None:
    config = make_config()
    assert config_version(config, FoldSettings()) == config_version(make_config(), FoldSettings())
    assert config_version(config, FoldSettings()) != config_version(config, FoldSettings(retry_base_ms=500))
    other = make_config(minConfidence=0.9)
    assert config_version(other, FoldSettings()) != config_version(config, FoldSettings())


def test_the_book_knows_the_first_and_the_latest_applied_document() -> None:
    one = ConfigDocument.of(make_config(), FoldSettings())
    two = ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=700))
    book = ConfigBook([one, two])
    assert book.first == one and book.latest == two
    assert book.in_force(None) == one  # before a partition's first marker
    assert book.in_force(two.version) == two
    book.add(one)
    assert book.latest == one and book.first == one


def test_a_marker_is_told_from_records_that_merely_quote_its_type() -> None:
    marker = ConfigApplied(version="abc", at_ms=T0)
    assert parse_marker(marker.model_dump_json().encode()) == marker
    assert parse_marker(b'{"type": "webhook_received", "event": "config_applied"}') is None
    assert parse_marker(None) is None


def test_a_replay_folds_each_partition_under_the_version_of_its_last_marker() -> None:
    slow = ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=5000))
    fast = ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=100))
    replay = LogReplay(book=ConfigBook([slow, fast]))
    webhook = WebhookReceived(at_ms=T0, account_id=ACCOUNT, conversation_id=CONV, event="message_created")
    replay.feed(webhook.model_dump_json().encode(), 0, partition=0)
    key = f"{ACCOUNT}:{CONV}"
    assert replay.trail(key).state.config_version == slow.version  # no marker yet: the first applied
    replay.feed(ConfigApplied(version=fast.version, at_ms=T0).model_dump_json().encode(), 1, partition=0)
    replay.feed(webhook.model_copy(update={"at_ms": T0 + 1}).model_dump_json().encode(), 2, partition=0)
    trail = replay.trail(key)
    assert trail.state.config_version == fast.version
    assert [e.what for e in trail.entries if e.what.startswith("configuration")] == [
        "configuration",
        "configuration changed",
    ]
    assert replay.versions.markers == 1 and replay.undecodable == 0
