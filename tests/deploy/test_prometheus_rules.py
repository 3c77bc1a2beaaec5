"""deploy/prometheus: the alerting rules for fleetlens watching itself, checked by promtool and by a real
Prometheus, on the metric names that a real hub and a real exporter expose."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.hubserver import HubProcess, hub_process
from tests.support.peers import fleetlens_exporter, peer, prometheus, require_binary, stop
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "fleetlens-alerts.yml"
RULE_TESTS = RULES_DIR / "fleetlens-alerts.test.yml"
SPOOL_FILL = "fleetlens_hub:spool_fill:ratio"
WAIT_S = 60.0  # a ceiling on waiting for Prometheus to scrape and evaluate, not a timing assertion

# The series each rule selects. promql-parser (the PyPI PromQL parser) is not installed, and neither
# promtool nor Prometheus lists an expression's selectors, so the names are listed here; the test against
# a real Prometheus checks this list against the expressions as Prometheus's own parser prints them.
RULE_METRICS: dict[str, set[str]] = {
    SPOOL_FILL: {"fleetlens_hub_spool_bytes", "fleetlens_hub_spool_max_bytes"},
    "FleetlensHubDown": {"up"},
    "FleetlensHubAbsent": {"up"},
    "FleetlensHubScrapesGetNoSamples": {"fleetlens_hub_scrapes_total", "fleetlens_hub_samples_total"},
    "FleetlensHubTargetsFailing": {"fleetlens_hub_scrapes_failed_total", "fleetlens_hub_scrapes_total"},
    "FleetlensHubScrapeTicksSkipped": {"fleetlens_hub_scrape_ticks_skipped_total"},
    "FleetlensHubSpoolNearlyFull": {SPOOL_FILL},
    "FleetlensHubSpoolNotDraining": {
        "fleetlens_hub_spool_entries",
        "fleetlens_hub_spool_replayed_entries_total",
    },
    "FleetlensHubSpoolDroppingData": {"fleetlens_hub_spool_dropped_rows_total"},
    "FleetlensHubStoreInsertsFailing": {"fleetlens_hub_store_insert_failures_total"},
    "FleetlensHubStoreRefusingRows": {"fleetlens_hub_refused_rows_total"},
    "FleetlensHubSpoolSetAside": {"fleetlens_hub_spool_set_aside_total"},
    "FleetlensHubDetectionStalled": {"fleetlens_hub_detection_cycles_total"},
    "FleetlensHubDetectionSlow": {"fleetlens_hub_detection_duration_seconds"},
    "FleetlensHubDetectionFailing": {"fleetlens_hub_detection_failures_total"},
    "FleetlensHubAlertingFailing": {"fleetlens_hub_alerting_failures_total"},
    "FleetlensExporterDown": {"up"},
    "FleetlensExporterCollectorFailing": {"fleetlens_exporter_collector_success"},
    "FleetlensExporterReadErrors": {"fleetlens_exporter_read_errors_total"},
}
SCRAPE_JOBS = {"fleetlens-hub", "fleetlens-exporter"}  # the job names the `up` rules select


def rules() -> list[dict]:
    """Every rule of the rules file, alerting and recording."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def rule_name(rule: dict) -> str:
    """An alert's name, or the series a recording rule writes."""
    return rule.get("alert") or rule["record"]


def promtool(*args: str) -> subprocess.CompletedProcess:
    """promtool's verdict, run in the rules' folder (the unit tests name the rules file relative to it)."""
    binary = require_binary("promtool")
    return subprocess.run([binary, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120)


def exposed_series_names(exposition: str) -> set[str]:
    """The series names an exposition declares, by prometheus_client's parser: a counter's family is
    named without `_total`, and a family with no sample yet (a failure never seen) still counts."""
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "summary": ["_sum", "_count"],
    }
    return {
        family.name + suffix
        for family in text_string_to_metric_families(exposition)
        for suffix in suffixes.get(family.type, [""])
    }


def scrape(url: str) -> str:
    """The body a GET of `url` answers."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


@dataclass(frozen=True)
class Fleet:
    """A real hub scraping a real exporter, both on loopback."""

    hub: HubProcess
    exporter_metrics_url: str


@pytest.fixture(scope="module")
def fleet(procfs_sys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A real exporter (simulated GPUs, the procfs fixture tree) and a real hub that scrapes it and runs a
    detector, so that the hub's scraper and detection metrics are on its /metrics too."""
    work = tmp_path_factory.mktemp("fleet")
    args, metrics_url = fleetlens_exporter(
        "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys), "--node", "vela-001"
    )
    target = metrics_url.removeprefix("http://").removesuffix("/metrics")
    (work / "targets.json").write_text(json.dumps([{"targets": [target]}]))
    hub_flags = ("--targets", str(work / "targets.json"), "--detectors", "slow_node", "--interval-s", "1")
    with peer(args, metrics_url), hub_process(work, *hub_flags) as hub:
        yield Fleet(hub, metrics_url)


def test_promtool_check_rules_finds_every_rule_valid():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_promtool_unit_tests_fire_and_stay_quiet_as_written():
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def input_series(test: dict) -> list[tuple[str, dict[str, str]]]:
    """A promtool test's input series as (name, labels)."""
    parsed = []
    for entry in test["input_series"]:
        name, _, labels = entry["series"].partition("{")
        parsed.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels))))
    return parsed


def selected_inputs(name: str) -> set[str]:
    """The scraped series a rule reads, through the recording rules it reads."""
    return {
        source
        for selected in RULE_METRICS[name]
        for source in (selected_inputs(selected) if selected in RULE_METRICS else {selected})
    }


def test_each_alert_is_unit_tested_firing_and_quiet():
    """Every alert fires in a unit test that also holds a series it reads that matches none of the alerts
    expected (promtool fails on any alert not expected, so that series is shown quiet), or in a test that
    expects it silent."""
    fired, quiet = set(), set()
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            name, expected = case["alertname"], [alert["exp_labels"] for alert in case["exp_alerts"]]
            if not expected:
                quiet.add(name)
                continue
            fired.add(name)
            others = [
                labels
                for metric, labels in input_series(test)
                if metric in selected_inputs(name)
                and not any(
                    set(alert.items()) - {("severity", alert["severity"])} <= set(labels.items())
                    for alert in expected
                )
            ]
            if others:
                quiet.add(name)
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert alerts - fired == set(), "never fired in a unit test"
    assert alerts - quiet == set(), "never shown quiet in a unit test"


def test_each_alert_says_how_long_how_bad_where_and_what_to_do():
    for rule in (rule for rule in rules() if "alert" in rule):
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        where = "job fleetlens-hub" if name == "FleetlensHubAbsent" else "{{ $labels.instance }}"
        assert where in annotations["summary"] and where in annotations["description"], name


def test_rules_select_only_series_a_real_hub_and_exporter_expose(fleet: Fleet):
    assert set(RULE_METRICS) == {rule_name(rule) for rule in rules()}
    exposed = exposed_series_names(scrape(f"{fleet.hub.url}/metrics"))
    exposed |= exposed_series_names(scrape(fleet.exporter_metrics_url))
    exposed |= {"up"} | {rule["record"] for rule in rules() if "record" in rule}
    unknown = {name: selected - exposed for name, selected in RULE_METRICS.items() if selected - exposed}
    assert not unknown, f"rules select series no hub or exporter exposes: {unknown}"


def prometheus_get(base: str, path: str) -> dict:
    """The `data` of a Prometheus API answer, which must be a success."""
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as answer:
        reply = json.load(answer)
    assert reply["status"] == "success", reply
    return reply["data"]


@contextlib.contextmanager
def prometheus_watching(fleet: Fleet, work: Path) -> Iterator[str]:
    """Debian's Prometheus with the rules loaded, scraping the fleet's hub and exporter under the job names
    the rules expect, every second; its base URL."""
    hub_target = fleet.hub.url.removeprefix("http://")
    exporter_target = fleet.exporter_metrics_url.removeprefix("http://").removesuffix("/metrics")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "fleetlens-hub", "static_configs": [{"targets": [hub_target]}]},
            {"job_name": "fleetlens-exporter", "static_configs": [{"targets": [exporter_target]}]},
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    args, base = prometheus(work)
    with peer(args, f"{base}/-/ready"):
        yield base


def selected_names(query: str) -> set[str]:
    """The fleetlens series and `up` named in an expression as Prometheus's parser prints it (a label value
    such as "fleetlens-hub" is no identifier of this form)."""
    identifiers = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", re.sub(r'"[^"]*"', "", query))
    return {name for name in identifiers if name.startswith("fleetlens_") or name == "up"}


def alerts_named(base: str, name: str) -> list[dict]:
    """The alerts Prometheus holds (pending or firing) of the rule `name`."""
    alerts = prometheus_get(base, "/api/v1/alerts")["alerts"]
    return [alert for alert in alerts if alert["labels"]["alertname"] == name]


def test_real_prometheus_loads_every_rule_and_pages_when_the_hub_stops(fleet: Fleet, tmp_path: Path):
    with prometheus_watching(fleet, tmp_path) as base:

        def evaluated_rules() -> list[dict] | None:
            groups = prometheus_get(base, "/api/v1/rules")["groups"]
            loaded = [rule for group in groups for rule in group["rules"]]
            evaluated = all(not rule["lastEvaluation"].startswith("0001-") for rule in loaded)
            return loaded if loaded and evaluated else None

        loaded = wait_for(evaluated_rules, "every rule evaluated", WAIT_S)
        assert {rule["name"]: rule["health"] for rule in loaded} == dict.fromkeys(RULE_METRICS, "ok")
        assert {rule["name"]: selected_names(rule["query"]) for rule in loaded} == RULE_METRICS
        hub_up = urllib.parse.urlencode({"query": 'up{job="fleetlens-hub"} == 1'})
        wait_for(
            lambda: prometheus_get(base, f"/api/v1/query?{hub_up}")["result"], "the hub scraped as up", WAIT_S
        )
        assert not alerts_named(base, "FleetlensHubDown")

        stop(fleet.hub.process)

        [alert] = wait_for(
            lambda: alerts_named(base, "FleetlensHubDown"), "FleetlensHubDown once the hub stopped", WAIT_S
        )
        assert alert["state"] == "pending"  # `for: 2m` holds it back from firing yet
        assert alert["labels"]["instance"] == fleet.hub.url.removeprefix("http://")
        assert alert["annotations"]["summary"] == f"fleetlens hub {alert['labels']['instance']} is down"
