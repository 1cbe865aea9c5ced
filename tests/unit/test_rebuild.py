"""`replay state` folds the log into exactly the table values a worker holds (projections.logs.rebuild)."""

from __future__ import annotations

from projections.fold import wakeup_of
from projections.logs.rebuild import TableBuilder
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import ConfigApplied
from schemas.state import ConversationState
from tests.unit.test_fold_driver import ACCOUNT, CONV, Driver, incoming


def test_the_rebuilt_state_is_the_fold_of_the_log_with_its_timer_and_version() -> None:
    driver = Driver()
    driver.chatwoot.messages.append(incoming(1, "I was charged twice, please refund my invoice"))
    driver.chatwoot.lost["assign"] = 1  # the run is still waiting when the log ends
    driver.webhook()
    document = ConfigDocument.of(driver.config, FoldSettings(retry_base_ms=driver.retry_base_ms))
    builder = TableBuilder(ConfigBook([document]))
    builder.feed_conversation(ConfigApplied(version=document.version, at_ms=0).model_dump_json().encode(), 3, 0)
    for offset, event in driver.log:
        builder.feed_conversation(event.model_dump_json().encode(), 3, offset)
    builder.feed_conversation(b"not a record", 3, 999)
    key = f"{ACCOUNT}:{CONV}"
    tables = builder.tables()
    partition, state = tables["conversation_state"][key]
    assert partition == 3
    versioned = {"config_version": document.version, "first_version": document.version}  # folded under it
    assert state == driver.state.model_copy(update=versioned).model_dump(mode="json")
    assert wakeup_of(ConversationState.model_validate(state)) == driver.wakeup  # the due time is in the state
    assert tables["timers"] == {key: (3, {"p": 3})}  # listed: its due time is in its state
    assert tables["partition_configs"] == {"conversations:3": (3, document.version)}
    assert builder.runs_in_flight() == 1 and builder.undecodable == 1
