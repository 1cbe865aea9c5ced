"""The fold's cost per record (issue 25, "Readers at scale"): `projections/fold.py` over the recorded demo histories.

Every history of `tests/golden/demo` (404 records, every record type of the log) is decoded once, then folded
per conversation from an empty state `--rounds` times; the best round is reported in microseconds per record, on
CPU time (`time.process_time`), so that other processes on the machine weigh less. `--tree DIR` measures the
fold of another tree (one exported with `git archive`), to compare two versions alternately on the same machine:

    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/fold_bench.py --tree /tmp/before; .venv/bin/python bench/fold_bench.py   # alternate, repeat
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="the code to measure")
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    from projections.fold import fold
    from schemas.codec import decode_conversation_event
    from schemas.state import ConversationState
    from tests.golden.histories import histories, settings_of

    config, retry_base_ms = settings_of(tree / "tests" / "golden" / "demo")
    logs = [
        [decode_conversation_event(json.dumps(json.loads(line)["record"]).encode()) for line in lines]
        for h in histories()
        if h.directory.name == "demo" and (lines := h.events_path.read_text().splitlines())
    ]
    count = sum(len(log) for log in logs)
    best = float("inf")
    for _ in range(args.rounds):
        started = time.process_time()
        for log in logs:
            state = ConversationState()
            for offset, event in enumerate(log):
                state = fold(state, event, offset, config, retry_base_ms=retry_base_ms).state
        best = min(best, (time.process_time() - started) / count * 1e6)
    assert Path(fold.__code__.co_filename).is_relative_to(tree), fold.__code__.co_filename
    print(f"{tree}: {count} records, the fold's best of {args.rounds} rounds: {best:.2f} µs per record")


if __name__ == "__main__":
    main()
