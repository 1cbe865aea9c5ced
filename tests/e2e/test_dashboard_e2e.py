"""The Grafana dashboard's metrics against the running ingress and worker: every name it queries is served."""

from __future__ import annotations

from tests.support.stack import Stack
from tests.unit.test_grafana_dashboard import REQUIRED, dashboard_exprs, exported_names, metric_names


def test_every_dashboard_metric_is_served_by_the_running_processes(e2e: Stack) -> None:
    worker = e2e.metrics()
    ingress = e2e.http.get(f"http://127.0.0.1:{e2e.ingress_port}/metrics").text
    exported = exported_names(worker + ingress)
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert used - set(exported) == set()
    assert {exported[name] for name in used} >= REQUIRED
