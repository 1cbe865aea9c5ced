"""Every phase a run can wait in has exactly one handler for its command's outcome."""

from __future__ import annotations

from typing import get_args

from projections.route.phases import PHASE_HANDLERS
from schemas.state import Phase


def test_every_phase_has_a_handler_and_no_handler_lacks_a_phase() -> None:
    assert set(PHASE_HANDLERS) == set(get_args(Phase))
    assert len(set(PHASE_HANDLERS.values())) == len(PHASE_HANDLERS)  # no handler serves two phases by accident
