"""Ports for local brokers and test processes come from outside the ephemeral range, so no outgoing connection
can take one between its choice and its (re)bind."""

from __future__ import annotations

import socket

import pytest

from streams.kafka import ports
from streams.kafka.ports import NoFreePort, ephemeral_range, free_port, free_port_run, port_in_use, quiet_spans


def test_the_quiet_spans_leave_out_the_ephemeral_range_and_the_low_ports() -> None:
    assert quiet_spans((32768, 60999)) == [range(10000, 32768), range(61000, 65536)]
    assert quiet_spans((49152, 65535)) == [range(10000, 49152)]
    assert quiet_spans((1024, 65535)) == []  # every port may be an outgoing connection's


def test_linux_range_is_read_from_proc_and_defaults_to_ianas(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("40000\t50000\n", encoding="ascii")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", proc)
    assert ephemeral_range() == (40000, 50000)
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "absent")
    assert ephemeral_range() == ports.IANA_DYNAMIC


def test_ports_handed_out_are_outside_the_ephemeral_range_free_and_never_repeated() -> None:
    low, high = ephemeral_range()
    chosen = [free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    assert all(port >= ports.PORT_FLOOR and not low <= port <= high for port in chosen)
    assert not any(port_in_use(port) for port in chosen)


def test_a_run_is_consecutive_free_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    first = free_port_run(3)
    assert all(not low <= first + n <= high and not port_in_use(first + n) for n in range(3))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        monkeypatch.setattr(ports, "quiet_spans", lambda _: [range(taken, taken + 2)])
        assert free_port() == taken + 1  # the only other port of the span
        with pytest.raises(NoFreePort, match="in 20 attempts"):
            free_port_run(1, attempts=20)  # the listened one, and one already handed out


def test_no_quiet_span_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(NoFreePort, match="outside the ephemeral range"):
        free_port()
