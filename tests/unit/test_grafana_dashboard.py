"""The Grafana dashboard (deploy/grafana/) is valid, and every metric it queries is one the processes export.

The names are checked against the exposition text of the ingress's and the worker's own registries (what their
`GET /metrics` serve); `tests/e2e/test_dashboard_e2e.py` checks them against the running processes too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from handlers.ingress.door import IngressMetrics
from handlers.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "chatwoot-router.json"
PANEL_TYPES = {"row", "timeseries", "stat"}
# PromQL words that look like metric names in an expression
_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "sum", "min", "max", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "le",
}  # fmt: skip
# what issue 13 asks the dashboard to show, as metric families
REQUIRED = {
    "chatwoot_router_ingress_requests",  # webhooks by outcome
    "chatwoot_router_ingress_produce_seconds",  # produce latency
    "router_events_folded",  # records folded
    "router_effect_commands",  # commands by op
    "router_effect_outcomes",  # outcomes by op and class
    "router_effect_seconds",  # effect latency
    "router_turn_outcomes",  # turns by result
    "router_handoffs",  # ... and reason
    "router_timers_pending",
    "router_consumer_lag",
    "router_dlq_records",
}


def exported_names(exposition: str) -> dict[str, str]:
    """Sample name -> its family, for every family in a /metrics text (samples follow from the family's type)."""
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(exposition):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = family.name
        for sample in family.samples:
            names[sample.name] = family.name
    return names


def process_exposition() -> str:
    return (generate_latest(IngressMetrics().registry) + generate_latest(WorkerMetrics().registry)).decode()


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, including $__rate_interval
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping labels
    found = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(0), text[match.end() :].lstrip()
        if word in _PROMQL_WORDS or rest.startswith("("):
            continue
        found.add(word)
    return found


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] if p["type"] != "row" for t in p["targets"]]


def test_the_dashboard_is_a_valid_provisionable_grafana_dashboard() -> None:
    d = dashboard()
    assert d["uid"] == "chatwoot-router" and d["title"] and isinstance(d["schemaVersion"], int)
    [variable] = d["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, p["title"]
        columns, lines = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        mine = {(x, y) for x in columns for y in lines}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for target in p["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert metric_names(target["expr"]), target["expr"]


def test_every_metric_the_dashboard_queries_is_exported_and_the_issue_s_are_all_shown() -> None:
    exported = exported_names(process_exposition())
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert used - set(exported) == set(), "the dashboard queries metrics no process exports"
    assert REQUIRED - {exported[name] for name in used} == set()
    for expr in dashboard_exprs():
        if "histogram_quantile" in expr:
            assert "_bucket" in expr and "le" in expr, expr


def test_the_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, op) (rate(router_effect_seconds_bucket{class!="ok"}[$__rate_interval])))'
    )
    assert metric_names(expr) == {"router_effect_seconds_bucket"}
    assert metric_names("sum(a_total) / sum(b_count)") == {"a_total", "b_count"}


def test_compose_runs_prometheus_and_grafana_under_the_observability_profile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["observability"], name
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]}
    assert targets["ingress"] == ["ingress:8080"]
    assert set(targets["worker"]) == {"worker-1:6066", "worker-2:6066"}
    assert services["ingress"]["command"][-1] == "8080" and "6066" in services["worker-1"]["command"]
    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["uid"] == "prometheus"
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
