"""dashboards/carpool.json is importable as is (a Prometheus datasource variable, every panel
with a query) and every series it queries is one Carpool exports, with labels that metric has:
the reference is a live ``Metrics`` registry's families, not a list kept by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gateway.telemetry.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "carpool.json"
SERIES = re.compile(r"\b((?:carpool|gen_ai)_[a-z0-9_]+)\s*(\{[^}]*\})?")
SELECTOR_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\bby\s*\(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for every family the registry declares."""
    out: dict[str, set[str]] = {}
    # the registry's own index of sample names (the public collect() omits labelled metrics
    # that have no child yet, and with them their label names)
    for name, collector in Metrics().registry._names_to_collectors.items():
        labels = set(getattr(collector, "_labelnames", ()))
        out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] if p["type"] != "row" for t in p["targets"]]


def test_dashboard_is_importable() -> None:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30
    var = doc["templating"]["list"][0]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["title"] and p["gridPos"]["w"] > 0
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"]


def test_every_queried_metric_is_exported_with_its_labels() -> None:
    names = exported()
    seen = set()
    for expr in queries():
        metrics_here: list[str] = []
        for name, selector in SERIES.findall(expr):
            assert name in names, f"{name} (in {expr!r}) is not exported"
            metrics_here.append(name)
            seen.add(name)
            for label in SELECTOR_LABEL.findall(selector or ""):
                assert label in names[name], f"{name} has no label {label!r}"
        for group in BY.findall(expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                assert any(label in names[m] for m in metrics_here), f"by ({label}) in {expr!r}"
    # the panels of the console: per tier, engine and tenants
    for wanted in ("carpool_queue_depth", "gen_ai_server_time_to_first_token_seconds_bucket",
                   "gen_ai_server_time_per_output_token_seconds_bucket",
                   "carpool_engine_batch_size_bucket", "carpool_kv_blocks",
                   "carpool_preemptions_total", "carpool_swap_blocks_total",
                   "carpool_tenant_tokens_total", "carpool_admissions_total"):
        assert wanted in seen
