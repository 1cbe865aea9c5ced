"""Where a worker's CPU goes, from `py-spy record --format raw` profiles (`bench/worker_bench.py --profile FILE`).

Each sample's stack is put in one bucket, the first rule that matches (docs/benchmarks.md, issue 23):

- the effect lanes (`handlers/worker/lanes.py`: the executor, its HTTP calls, the chained reads), split into HTTP
  (httpx, aiohttp), Kafka sends from a lane, and ours;
- the agents (Faust's `Agent._execute_actor`, our handler inside it), split into ours (decode, fold, admission)
  and Faust below ours (sends, table get/set);
- commits (the write cache, the producer flush, the offset commit), the producer's sender, the fetcher;
- the event loop's `select` (the main loop's and Faust's consumer thread's), counted apart: py-spy's
  `--nonblocking` samples cannot always tell a thread waiting in epoll from one running.

    .venv/bin/python bench/profile_split.py PROFILE [PROFILE ...]
"""

from __future__ import annotations

import sys
from collections import Counter

OURS = ("(handlers/", "(projections/", "(schemas/")


def bucket(frames: list[str]) -> str:
    stack = ";".join(frames)
    if "Lanes._run" in stack:
        if "(httpx" in stack or "(aiohttp/" in stack:
            return "effect lanes: HTTP (httpx, aiohttp)"
        if "(aiokafka/" in stack or "(faust/" in stack:
            return "effect lanes: Kafka sends (Faust, aiokafka)"
        return "effect lanes: ours (executor, chained reads, their folds)"
    if "Agent._execute_actor" in stack:
        ours = [i for i, frame in enumerate(frames) if any(o in frame for o in OURS)]
        if not ours:
            return "agents: Faust's stream, above our handler"
        below = ";".join(frames[ours[0] :])
        if "(faust/" in below or "(aiokafka/" in below:
            return "agents: Faust below ours (sends, table get/set)"
        return "agents: ours (decode, fold, admission)"
    if "_commit" in stack or "before_commit" in stack:
        return "commits (cache write, flush, offset commit)"
    if "EpollSelector.select" in frames[-1]:
        return "select (waiting, or not told apart from it)"
    if "Sender." in stack or "(aiokafka/producer" in stack:
        return "producer (aiokafka's sender)"
    if "Fetcher" in stack or "(aiokafka/consumer" in stack or "getmany" in stack:
        return "consumer: fetch (Faust, aiokafka)"
    if "(faust/" in stack or "(mode/threads" in stack:
        return "Faust, other"
    if "(asyncio/" in frames[-1]:
        return "event loop, other"
    return "other"


def main(paths: list[str]) -> int:
    counts: Counter[str] = Counter()
    total = 0
    for path in paths:
        with open(path) as profile:
            for line in profile:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                if stack:
                    counts[bucket(stack.split(";"))] += int(n)
                    total += int(n)
    busy = total - counts["select (waiting, or not told apart from it)"]
    print(f"{total} samples, {busy} not in select")
    for name, n in counts.most_common():
        share = "" if name.startswith("select") else f"{100 * n / busy:5.1f}% of the rest"
        print(f"  {100 * n / total:5.1f}%  {share:>20}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
