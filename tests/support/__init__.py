"""Helpers shared by the tests and the benchmarks (`bench/`), one job per module; fixtures stay in the conftests.

- `waiting`: `wait_until` polls a condition up to a deadline; `within` puts a deadline on what a test awaits.
- `env`: the environment of a router subprocess, free of the caller's own router variables.
- `kafka`: create, describe and read topics of the real broker.
- `processes`: a `chatwoot-router` command as a child process (`handlers.processes.Child`, set up for tests).
- `stack`: the end-to-end stack (sandbox, ingress, worker) and the sandbox's control API.
"""
