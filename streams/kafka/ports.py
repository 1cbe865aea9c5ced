"""Free TCP ports on 127.0.0.1 for the local brokers, the tests' processes and the benchmarks.

A port is chosen outside the kernel's ephemeral range. A port chosen inside it (what binding port 0 gives) can be
taken, between the choice and the bind, as the local port of any outgoing connection on the machine, and a
process that binds it again later (a restarted broker, a worker started again after a broker fault) finds it in
use: one CI run lost a worker so.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_FLOOR = 10000  # below it live the well-known and registered services a developer may run
IANA_DYNAMIC = (49152, 65535)  # the ephemeral range of macOS and Windows, and Linux's when /proc says nothing
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_handed_out: set[int] = set()  # never the same port twice in one process, even once its user has let it go
_random = random.Random()


class NoFreePort(RuntimeError):
    """No run of free ports was found outside the ephemeral range."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (both ends included)."""
    try:
        low, high = _EPHEMERAL_RANGE.read_text(encoding="ascii").split()
        return int(low), int(high)
    except (OSError, ValueError):
        return IANA_DYNAMIC


def quiet_spans(ephemeral: tuple[int, int]) -> list[range]:
    """The ports from PORT_FLOOR up that no outgoing connection is given, largest first."""
    low, high = ephemeral
    spans = [range(PORT_FLOOR, min(low, 65536)), range(max(high + 1, PORT_FLOOR), 65536)]
    return sorted((span for span in spans if len(span) > 0), key=len, reverse=True)


def port_in_use(port: int) -> bool:
    """Whether something already listens on (or holds) 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def free_port_run(count: int, *, attempts: int = 500) -> int:
    """The first of `count` consecutive ports on 127.0.0.1, free a moment ago and never handed out before by this
    process, outside the ephemeral range."""
    spans = [span for span in quiet_spans(ephemeral_range()) if len(span) >= count]
    if not spans:
        raise NoFreePort(f"no {count} consecutive ports from {PORT_FLOOR} up lie outside the ephemeral range")
    weights = [len(span) for span in spans]
    for _ in range(attempts):
        span = _random.choices(spans, weights)[0]
        first = _random.randrange(span.start, span.stop - count + 1)
        ports = range(first, first + count)
        if any(port in _handed_out for port in ports) or any(port_in_use(port) for port in ports):
            continue
        _handed_out.update(ports)
        return first
    raise NoFreePort(f"found no {count} consecutive free ports on 127.0.0.1 in {attempts} attempts")


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago, outside the ephemeral range."""
    return free_port_run(1)
