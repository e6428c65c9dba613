"""deploy/prometheus and deploy/grafana: the alert rules pass promtool (syntax and their own unit
tests), /metrics passes promtool's lint, and every metric the rules, the adapter, the HPA and
the dashboard name is one the server or a job worker exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app.jobs.metrics import JobMetrics
from app.metrics import Metrics
from tests.conftest import app_client, make_settings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "batchserve.json"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("needs promtool (Debian's prometheus package; .ci/run installs it)")
    return path


def exported() -> set[str]:
    """Every sample name the server and a job worker can export."""
    metrics = Metrics.create()
    JobMetrics.create(metrics.registry)
    return {family.name + suffix for family in metrics.registry.collect()
            for suffix in SUFFIXES[family.type]}


def named_in(path: Path) -> set[str]:
    return set(re.findall(r"\bbatchserve_[a-z_]+", path.read_text()))


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    tool = promtool()
    check = subprocess.run([tool, "check", "rules", "alerts.yaml"], cwd=PROMETHEUS,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([tool, "test", "rules", "alerts_test.yaml"], cwd=PROMETHEUS,
                           capture_output=True, text=True, timeout=60)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


@pytest.mark.asyncio
async def test_the_metrics_page_passes_promtools_lint() -> None:
    tool = promtool()
    async with app_client(make_settings()) as client:
        await client.post("/predict", json={"instances": [[1, 2, 3, 4]]})
        await client.post("/predict", json={"instances": [[1, 2, 3]]})  # a refusal: 422
        text = (await client.get("/metrics")).text
    lint = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout


@pytest.mark.parametrize("path", [
    PROMETHEUS / "alerts.yaml", PROMETHEUS / "adapter-rules.yaml", DASHBOARD,
    ROOT / "deploy" / "kubernetes" / "base" / "hpa.yaml",
], ids=lambda p: p.name)
def test_every_metric_named_is_exported(path: Path) -> None:
    names = named_in(path)
    assert names, f"{path.name} names no metric"
    assert names <= exported(), sorted(names - exported())


def test_the_dashboard_covers_what_the_issue_asks() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}"
                                        for t in panel["targets"])
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in ("batchserve_requests_total", "batchserve_request_duration_seconds_bucket",
                   "batchserve_queue_depth", "batchserve_queue_wait_seconds_bucket",
                   "batchserve_batch_size_sum", "batchserve_device_busy_ratio",
                   "batchserve_rejected_total"):
        assert metric in exprs
    assert 'model=~"$model"' in exprs  # per model, chosen on the dashboard
    # Provisioned: the ${datasource} its panels use is a Prometheus one, and Grafana is given
    # a Prometheus data source and a file provider for the dashboards folder.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert [d["type"] for d in sources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((provisioning / "dashboards" / "batchserve.yaml").read_text())
    assert [p["type"] for p in providers["providers"]] == ["file"]
