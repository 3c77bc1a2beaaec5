"""The configuration object: precedence flag > environment > file > default, and errors that say where."""

from dataclasses import fields
from pathlib import Path

import pytest

from collectors.base import CollectorOptions
from fleetlens.config import ExporterConfig, HubConfig, load_config, split_listen
from fleetlens.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleetlens.yaml"
    path.write_text(text)
    return path


def test_defaults_without_any_source():
    config = load_config(env={})
    assert config.exporter.listen == "0.0.0.0:9612"
    assert config.exporter.gpu_backend == "nvml"
    assert config.exporter.sysfs_root == Path("/sys")


def test_flag_beats_environment_beats_file(tmp_path):
    path = write(tmp_path, "exporter:\n  gpu_backend: none\n  node: from-file\n  listen: 127.0.0.1:1\n")
    env = {"FLEETLENS_EXPORTER_NODE": "from-env", "FLEETLENS_EXPORTER_LISTEN": "127.0.0.1:2"}
    config = load_config(path, env=env, overrides={"exporter": {"listen": "127.0.0.1:3", "node": None}})
    assert config.exporter.gpu_backend == "none"  # file only
    assert config.exporter.node == "from-env"  # env over file; a flag left unset (None) does not override
    assert config.exporter.listen == "127.0.0.1:3"  # flag over env and file
    assert config.exporter.host_port == ("127.0.0.1", 3)


def test_environment_values_are_converted_to_field_types():
    env = {"FLEETLENS_EXPORTER_GPU_SIM_COUNT": "4", "FLEETLENS_EXPORTER_DISABLE_COLLECTORS": "gpu, xid"}
    config = load_config(env=env)
    assert config.exporter.gpu_sim_count == 4
    assert config.exporter.disable_collectors == ("gpu", "xid")


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("exporter: {gpu_backend: cuda}", {}, "exporter.gpu_backend: 'cuda' is not one of nvml, sim, none"),
        ("exporter:\n  gpu_sim_count: many\n", {}, "exporter.gpu_sim_count: expected int, got 'many'"),
        ("exporter:\n  colour: blue\n", {}, "exporter.colour: unknown key"),
        ("exporterz: {}\n", {}, "unknown section(s) exporterz"),
        ("exporter: [1, 2]\n", {}, "section exporter must be a mapping"),
        ("exporter: {listen: 'nowhere'}\n", {}, "exporter.listen: 'nowhere' is not HOST:PORT"),
        ("exporter: {\n", {}, "not valid YAML"),
        ("", {"FLEETLENS_EXPORTER_GPU_SIM_SEED": "1.5"}, "environment FLEETLENS_EXPORTER_GPU_SIM_SEED"),
    ],
)
def test_bad_config_names_what_and_where(tmp_path, text, env, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    assert message in str(info.value)
    if not env:
        assert str(path) in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        load_config(tmp_path / "absent.yaml", env={})


def test_every_collector_option_has_a_config_key():
    """build_exporter hands config keys to collectors by name: a new option needs a config key too."""
    assert {f.name for f in fields(CollectorOptions)} <= {f.name for f in fields(ExporterConfig)}


def test_bad_interface_regex_is_refused(tmp_path):
    path = write(tmp_path, "exporter: {netclass_ignored_devices: '(eth'}\n")
    with pytest.raises(ConfigError, match=r"exporter\.netclass_ignored_devices: not a regular expression"):
        load_config(path, env={})


def test_alert_rules_receivers_and_the_drain_policy_come_from_the_file_and_environment(tmp_path):
    path = write(
        tmp_path,
        """
alerts:
  alertmanager_urls: [http://127.0.0.1:9093]
  rules:
    - {name: HotGpu, kinds: [gpu_throttle], for_s: 30, labels: {team: gpu}}
drain:
  mode: auto
  backend: slurm
  rules: [{kinds: [gpu_fault], min_severity: critical}]
  limits: {max_nodes: 2}
""",
    )
    config = load_config(path, env={"FLEETLENS_DRAIN_LIMITS": '{"max_nodes": 3, "max_per_hour": 1}'})
    [rule] = config.alerts.alert_rules()
    assert (rule.name, rule.for_s, dict(rule.labels)) == ("HotGpu", 30, {"team": "gpu"})
    assert config.alerts.alertmanager_urls == ("http://127.0.0.1:9093",)
    policy = config.drain.policy()
    assert (policy.mode, policy.limits.max_nodes, policy.limits.max_per_hour) == ("auto", 3, 1)
    assert load_config(env={}).drain.policy().mode == "dry-run"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("drain: {mode: auto}", "drain.mode auto needs a drain.backend"),
        ("drain: {limits: {max_nodez: 2}}", r"drain.limits: unknown key\(s\) \['max_nodez'\]"),
        ("drain: {backend: exec}", "needs drain.exec_command"),
        ("alerts: {rules: [{name: X, kinds: [a], for: 3}]}", r"alerts.rules\[0\]: unknown key"),
        ("alerts: {webhook_urls: [example.com/hook]}", "must start with http"),
        ("alerts: {rules: oops}", "alerts.rules: expected a list"),
    ],
)
def test_bad_alerting_config_names_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), env={})


def test_remote_write_settings_node_labels_and_detection_lag(tmp_path):
    path = write(tmp_path, "hub:\n  node_labels: [cluster_node, Hostname]\n  detect_lag_s: 30\n")
    config = load_config(path, env={"FLEETLENS_HUB_REMOTE_WRITE_MAX_SERIES": "1000"})
    assert config.hub.node_labels == ("cluster_node", "Hostname")
    assert config.hub.remote_write_max_series == 1000
    assert config.hub.lag_s == 30
    assert load_config(env={}).hub.lag_s == 10 + 5  # a scraping hub: the interval and the scrape timeout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hub: {node_labels: []}\n", "hub.node_labels: name at least one label"),
        ("hub: {remote_write_max_samples: 0}\n", "hub.remote_write_max_samples: must be positive"),
        ("hub: {detect_lag_s: -1}\n", "hub.detect_lag_s"),
    ],
)
def test_bad_remote_write_settings_name_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), env={})


# Ports of what else listens on a GPU VM or beside the hub, from Prometheus's default port allocations
# (https://github.com/prometheus/prometheus/wiki/Default-port-allocations) and the exporters' own docs.
GPU_VM_PEER_PORTS = {
    9090: "Prometheus",
    9091: "Pushgateway",
    9093: "Alertmanager",
    9094: "Alertmanager clustering",
    9100: "node_exporter",
    9256: "process-exporter",
    9290: "IPMI exporter",
    9400: "dcgm-exporter",
    9615: "Mellanox mlx5 exporter",
    9633: "smartctl_exporter",
    9835: "nvidia_gpu_exporter",
}


def test_the_exporters_default_port_is_no_peers_and_not_the_hubs():
    exporter_port = ExporterConfig().host_port[1]
    assert exporter_port not in GPU_VM_PEER_PORTS, GPU_VM_PEER_PORTS.get(exporter_port)
    assert exporter_port != split_listen(HubConfig().listen, "hub.listen")[1]
