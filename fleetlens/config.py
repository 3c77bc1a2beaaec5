"""One validated configuration object, with one explicit precedence.

    command-line flag  >  environment (FLEETLENS_<SECTION>_<KEY>)  >  config file (YAML)  >  default

Each section is a frozen dataclass; a value from any source is converted to the field's type, and a value
that does not fit raises ConfigError naming the source (flag, variable or file) and the key.
"""

from __future__ import annotations

import json
import os
import re
import socket
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from fleetlens.errors import ConfigError

if TYPE_CHECKING:
    from alerts.lifecycle import LifecyclePolicy
    from alerts.policy import DrainPolicy
    from alerts.rules import AlertRule


GpuBackend = str  # nvml, sim, none or replay:FILE[#N]: checked by check_gpu_backend
GPU_BACKENDS = ("nvml", "sim", "none")


def split_listen(listen: str, where: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 hosts in brackets) as (host, port); ConfigError naming `where` otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: {listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def parse_shard(shard: str) -> tuple[int, int]:
    """`--shard i/n` as (i, n): a hub scrapes the targets whose hash falls in shard i of n."""
    index, sep, count = shard.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and 0 <= int(index) < int(count)):
        raise ConfigError(f"hub.shard: {shard!r} is not i/n with 0 <= i < n")
    return int(index), int(count)


def check_gpu_backend(name: str, where: str) -> None:
    """ConfigError naming `where` unless `name` is one of GPU_BACKENDS or replay:FILE[#N] (whether FILE
    holds a capture is the backend's to say, when it opens)."""
    if name in GPU_BACKENDS:
        return
    from collectors.errors import GpuBackendError  # the exporter's: loaded when a replay is named
    from collectors.gpu.backend import is_replay, parse_replay_backend

    if not is_replay(name):
        raise ConfigError(f"{where}: {name!r} is not one of {', '.join(GPU_BACKENDS)}, or replay:FILE[#N]")
    try:
        parse_replay_backend(name)
    except GpuBackendError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_range(where: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(
            f"{where}: must be between {_number(low)} and {_number(high)}, got {_number(value)}"
        )


def _number(value: float) -> str:
    """A bound or value as written: whole numbers in full (a byte count), others shortest."""
    return str(value) if isinstance(value, int) else f"{value:g}"


@dataclass(frozen=True)
class ExporterConfig:
    """The per-VM exporter: where it listens, what it reads, which collectors run."""

    listen: str = "0.0.0.0:9612"  # FREE on Prometheus's port allocations: docs/exporter.md, "Port"
    sysfs_root: Path = Path("/sys")
    gpu_backend: GpuBackend = "nvml"
    node: str = field(default_factory=socket.gethostname)
    enable_collectors: tuple[str, ...] = ()
    disable_collectors: tuple[str, ...] = ()
    kernel_log: Path | None = None
    nccl_logs: str | None = None
    gpu_sim_seed: int = 0
    gpu_sim_count: int = 8
    gpu_poll_interval_s: float = 5.0  # NVML's cheap calls, per GPU (docs/exporter.md, "GPU reads")
    gpu_sample_interval_s: float = 10.0  # its sampling and slow calls
    gpu_replay_latency: Path | None = None  # a latency profile a replay pays (replay backends only)
    gpu_replay_latency_pick: str = "median"  # median or max
    netclass_ignored_devices: str = "^$"
    netclass_ignore_invalid_speed: bool = False
    kubernetes: bool = False  # label GPU series with the pod holding them (docs/exporter.md)
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    # scrapes in flight at once (collecting together, or rendering), past which one is answered 503;
    # 0: no bound (node_exporter's --web.max-requests, and its default)
    web_max_requests: int = 40
    # TLS, basic auth and headers, in exporter-toolkit's format (docs/tls.md); None: plain HTTP, open
    web_config_file: Path | None = None

    def __post_init__(self) -> None:
        split_listen(self.listen, "exporter.listen")
        check_gpu_backend(self.gpu_backend, "exporter.gpu_backend")
        try:
            re.compile(self.netclass_ignored_devices)
        except re.error as exc:
            raise ConfigError(f"exporter.netclass_ignored_devices: not a regular expression: {exc}") from None
        if self.gpu_sim_count < 0:
            raise ConfigError(f"exporter.gpu_sim_count: must be >= 0, got {self.gpu_sim_count}")
        _check_range("exporter.gpu_poll_interval_s", self.gpu_poll_interval_s, 0.01, 3600)
        _check_range("exporter.gpu_sample_interval_s", self.gpu_sample_interval_s, 0.01, 3600)
        if self.gpu_replay_latency is not None and not self.gpu_backend.startswith("replay:"):
            raise ConfigError(
                "exporter.gpu_replay_latency: a latency profile is paid by replay:FILE backends only"
            )
        if self.gpu_replay_latency_pick not in ("median", "max"):
            raise ConfigError(
                "exporter.gpu_replay_latency_pick: expected median or max,"
                f" got {self.gpu_replay_latency_pick!r}"
            )
        if self.web_max_requests < 0:
            raise ConfigError(
                f"exporter.web_max_requests: must be >= 0 (0: no bound), got {self.web_max_requests}"
            )

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen, "exporter.listen")


@dataclass(frozen=True)
class HubConfig:
    """The hub: what it scrapes, where it stores, what it accepts.

    Tokens are deliberately not here: FLEETLENS_API_TOKEN holds one with every scope, and `token_file`
    names a file of scoped tokens (hub.auth), never the config file itself.
    """

    store: str = "chdb://./data"
    targets: Path | None = None
    topology_file: Path | None = None  # the operator's inventory (docs/topology.md), re-read on change
    slurm_placements: bool = False  # poll `squeue --json` for what runs where (docs/placements.md)
    k8s_placements: bool = False  # poll the Kubernetes API server's pods for what runs where (same)
    listen: str = "127.0.0.1:9500"
    interval_s: float = 10.0
    scrape_timeout_s: float | None = None  # default: the interval, at most 5 s
    shard: str = "0/1"
    cluster: str | None = None
    raw_retention_days: int = 15
    rollup_retention_days: int = 400
    steps_retention_days: int = 90
    targets_retention_days: int = 15
    spool_dir: Path = Path("./spool")
    spool_max_bytes: int = 1 << 30
    max_body_bytes: int = 16 << 20
    max_series_per_target: int = 50_000
    max_label_length: int = 4096
    max_rows_per_request: int = 100_000
    # the query API: rows one answer holds at most (a client may ask fewer), seconds one request takes at
    # most (its wait for a slot included), and what one query may take of the store: defaults and why in
    # analytics.store.readonly.ReadLimits (ClickHouse's limits, set where no query can raise them)
    query_max_rows: int = 100_000
    query_max_seconds: float = 30.0
    query_max_memory_bytes: int = 256 << 20
    query_max_rows_to_read: int = 1_000_000_000
    query_max_bytes_to_read: int = 32 << 30
    query_max_result_bytes: int = 16 << 20
    query_max_threads: int = 1
    # samples one PromQL query holds in memory at most (16 bytes each), as Prometheus's --query.max-samples
    promql_max_samples: int = 10_000_000
    # queries at once, in all and per client (a token; an address on a hub without tokens), and how long
    # a query waits for a slot before its 429 (hub.queryslots)
    query_slots: int = 4
    query_slots_per_client: int = 2
    query_queue_s: float = 5.0
    detectors: str = "all"  # comma-separated detector names, "all", or "none" (no detection in the hub)
    detect_window_s: float = 10.0
    # how long after a window ends detection waits for its samples: default the interval plus the scrape
    # timeout; remote write senders batch and retry, so a hub fed by them waits longer (e.g. 30)
    detect_lag_s: float | None = None
    # which series label names a node, first present wins (`instance` loses its port): remote write
    node_labels: tuple[str, ...] = ("node", "Hostname", "instance")
    remote_write_max_series: int = 50_000  # series in one remote write request
    remote_write_max_samples: int = 100_000  # samples in one remote write request
    token_file: Path | None = None  # scoped API tokens: lines of "<read|write|act|all,...> <token>"
    # without any token the API answers loopback clients only, so listening elsewhere is refused at start
    # as a likely mistake (a token forgotten) unless this says it is meant
    listen_without_token: bool = False
    # TLS and headers for the API, in exporter-toolkit's format (docs/tls.md); None: plain HTTP
    web_config_file: Path | None = None

    def __post_init__(self) -> None:
        split_listen(self.listen, "hub.listen")
        _check_range("hub.interval_s", self.interval_s, 1, 60)
        _check_range("hub.detect_window_s", self.detect_window_s, 1, 3600)
        if self.scrape_timeout_s is not None:
            _check_range("hub.scrape_timeout_s", self.scrape_timeout_s, 0.1, self.interval_s)
        if self.detect_lag_s is not None:
            _check_range("hub.detect_lag_s", self.detect_lag_s, 0, 3600)
        if not self.node_labels:
            raise ConfigError("hub.node_labels: name at least one label (e.g. node, Hostname, instance)")
        parse_shard(self.shard)
        self._check_query_limits()
        for name in (
            "raw_retention_days",
            "rollup_retention_days",
            "steps_retention_days",
            "targets_retention_days",
            "spool_max_bytes",
            "max_body_bytes",
            "max_series_per_target",
            "max_label_length",
            "max_rows_per_request",
            "remote_write_max_series",
            "remote_write_max_samples",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"hub.{name}: must be positive, got {getattr(self, name)}")
        if self.rollup_retention_days < self.raw_retention_days:
            raise ConfigError(
                "hub.rollup_retention_days: the 1-minute rollup must be kept at least as long as raw"
            )

    def _check_query_limits(self) -> None:
        """Each of the query API's limits within what makes sense: a bound that cannot be met (0 seconds,
        no rows) or that bounds nothing (10^12 rows answered as JSON) is a mistake."""
        for name, low, high in (
            ("query_max_rows", 1, 1_000_000),
            ("query_max_seconds", 1, 3600),
            ("query_max_memory_bytes", 16 << 20, 1 << 40),
            ("query_max_rows_to_read", 1000, 10**12),
            ("query_max_bytes_to_read", 1 << 20, 1 << 50),
            ("query_max_result_bytes", 64 << 10, 1 << 30),
            ("query_max_threads", 1, 256),
            ("promql_max_samples", 1000, 1_000_000_000),
            ("query_slots", 1, 16),  # the most a store's read sessions run at once
            ("query_slots_per_client", 1, self.query_slots),
            ("query_queue_s", 0, self.query_max_seconds),
        ):
            _check_range(f"hub.{name}", getattr(self, name), low, high)

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen, "hub.listen")

    @property
    def timeout_s(self) -> float:
        """Per-target scrape timeout: as configured, else the interval up to 5 s (as Prometheus's default)."""
        return self.scrape_timeout_s if self.scrape_timeout_s is not None else min(self.interval_s, 5.0)

    @property
    def lag_s(self) -> float:
        """How long detection waits after a window's end for its samples to arrive."""
        return self.interval_s + self.timeout_s if self.detect_lag_s is None else self.detect_lag_s

    @property
    def shard_index_count(self) -> tuple[int, int]:
        return parse_shard(self.shard)

    @property
    def detector_names(self) -> list[str] | None:
        """The detectors to run: None for all of them, [] for none."""
        if self.detectors.strip() == "all":
            return None
        if self.detectors.strip() == "none":
            return []
        return [name.strip() for name in self.detectors.split(",") if name.strip()]


@dataclass(frozen=True)
class AlertsConfig:
    """Alert rules and receivers (the hub's alerting runs after each detection window).

    `rules`: a list of {name, kinds, min_severity, for_s, labels, annotations}; None keeps the defaults
    (alerts.rules.DEFAULT_RULES). Receivers get firing alerts again every `resend_s`. With no receiver,
    alerts go to the hub's log (alerts.notifiers.LogNotifier)."""

    alertmanager_urls: tuple[str, ...] = ()
    webhook_urls: tuple[str, ...] = ()
    resend_s: float = 60.0
    generator_url: str = ""  # where people see an alert's context, e.g. the UI's address
    rules: list | None = None

    def __post_init__(self) -> None:
        _check_range("alerts.resend_s", self.resend_s, 1, 3600)
        for url in (*self.alertmanager_urls, *self.webhook_urls):
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"alerts: receiver URL {url!r} must start with http:// or https://")
        self.alert_rules()

    def alert_rules(self) -> tuple[AlertRule, ...]:
        from alerts.errors import AlertConfigError  # the hub's; an exporter never loads alerting
        from alerts.rules import DEFAULT_RULES, parse_rules

        if self.rules is None:
            return DEFAULT_RULES
        try:
            return parse_rules(self.rules, "alerts.rules")
        except AlertConfigError as exc:
            raise ConfigError(str(exc)) from None


DrainMode = Literal["dry-run", "approve", "auto"]
DrainBackendName = Literal["none", "slurm", "kubernetes", "exec"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]  # alerts.backends.kubernetes's


@dataclass(frozen=True)
class DrainConfig:
    """The drain controller: its policy (alerts.policy: mode, rules, limits, cooldown) and its backend.

    Dry-run is the default and needs no backend; approve and auto need one."""

    mode: DrainMode = "dry-run"
    backend: DrainBackendName = "none"
    cooldown_s: float = 3600.0
    return_after_healthy_s: float | None = None
    hold_explained_s: float = 1800.0
    rules: list | None = None
    limits: dict | None = None
    exec_command: tuple[str, ...] = ()
    scontrol: str = "scontrol"
    kubernetes_evict: bool = False
    kubernetes_taint_key: str = "fleetlens.io/unhealthy"
    kubernetes_taint_effect: TaintEffect = "NoSchedule"

    def __post_init__(self) -> None:
        if self.kubernetes_taint_effect not in typing.get_args(TaintEffect):
            raise ConfigError(
                f"drain.kubernetes_taint_effect: {self.kubernetes_taint_effect!r} is not one of "
                f"{', '.join(typing.get_args(TaintEffect))}"
            )
        if self.mode != "dry-run" and self.backend == "none":
            raise ConfigError(f"drain.mode {self.mode} needs a drain.backend (slurm, kubernetes or exec)")
        if self.backend == "exec" and not self.exec_command:
            raise ConfigError("drain.backend exec needs drain.exec_command (the command and its arguments)")
        self.policy()

    def policy(self) -> DrainPolicy:
        from alerts.errors import AlertConfigError  # the hub's; an exporter never loads alerting
        from alerts.policy import parse_policy

        section: dict[str, Any] = {
            "mode": self.mode,
            "cooldown_s": self.cooldown_s,
            "return_after_healthy_s": self.return_after_healthy_s,
            "hold_explained_s": self.hold_explained_s,
            "limits": self.limits or {},
        }
        if self.rules is not None:
            section["rules"] = self.rules
        try:
            return parse_policy(section)
        except AlertConfigError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class LifecycleConfig:
    """The node lifecycle (alerts.lifecycle): nodes fleetlens drained are tested by `command` (an argument
    list with {node} and {checks}, run by the hub) and returned when their checks pass. Off unless
    `enabled`; the other keys are alerts.lifecycle.LifecyclePolicy's."""

    enabled: bool = False
    command: tuple[str, ...] = ()
    command_timeout_s: float = 3600.0
    test_after_s: float = 600.0
    retest_after_s: float = 3600.0
    test_timeout_s: float = 3600.0
    max_testing: int = 2
    checks: tuple[str, ...] = ("dcgm_diag", "remapped_rows", "power_slowdown")
    label_prefix: str = "autopilot.ibm.com"

    def __post_init__(self) -> None:
        _check_range("lifecycle.command_timeout_s", self.command_timeout_s, 1, 86400)
        self.policy()

    def policy(self) -> LifecyclePolicy:
        from alerts.errors import AlertConfigError  # the hub's; an exporter never loads alerting
        from alerts.lifecycle import LifecyclePolicy, parse_lifecycle_policy

        section = {f.name: getattr(self, f.name) for f in fields(LifecyclePolicy)}
        try:
            return parse_lifecycle_policy(section)
        except AlertConfigError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class Config:
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)

    def __post_init__(self) -> None:
        if not self.lifecycle.enabled:
            return
        if self.drain.return_after_healthy_s is not None:
            raise ConfigError(
                "drain.return_after_healthy_s must be null when lifecycle.enabled: the lifecycle returns "
                "drained nodes only after their checks pass"
            )
        if self.drain.mode != "dry-run" and not self.lifecycle.command:
            raise ConfigError(
                f"lifecycle.enabled with drain.mode {self.drain.mode} needs lifecycle.command (the argument "
                "list that runs the checks on {node}, e.g. [ssh, '{node}', fleetlens, checks, run, ...])"
            )


def _convert(value: Any, hint: Any, where: str) -> Any:
    """Convert `value` (from YAML, an environment string or a flag) to the annotated type `hint`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        if value is None or value == "":
            return None
        return _convert(value, options[0], where)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")
        return value
    if hint in (list, dict):  # structured values: YAML in a file, JSON in a variable or flag
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a {hint.__name__} (JSON), got {value!r}") from None
        if not isinstance(value, hint):
            raise ConfigError(f"{where}: expected a {hint.__name__}, got {value!r}")
        return value
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_convert(str(item).strip(), str, where) for item in items if str(item).strip())
    try:
        if hint is bool:
            if isinstance(value, str):
                lowered = value.lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(value)
                return lowered in ("1", "true", "yes")
            return bool(value)
        if hint is int and isinstance(value, bool | float):
            raise ValueError(value)
        if hint in (int, float, str, Path):
            return hint(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}") from None
    raise ConfigError(f"{where}: unsupported type {hint!r}")


def _section_values(section: type, raw: Mapping[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """Convert one source's values for `section`; `where(key)` names the key's origin in errors."""
    hints = typing.get_type_hints(section)
    names = {f.name for f in fields(section)}
    for key in raw:
        if key not in names:
            raise ConfigError(f"{where(key)}: unknown key; known: {', '.join(sorted(names))}")
    return {key: _convert(value, hints[key], where(key)) for key, value in raw.items()}


def _read_file(path: str | os.PathLike[str] | None) -> Mapping[str, Any]:
    """The config file's sections ({} without a file); ConfigError naming the file when it cannot be read."""
    if path is None:
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    file_values = loaded or {}
    if not isinstance(file_values, Mapping):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
    unknown = sorted(set(file_values) - {f.name for f in fields(Config)})
    if unknown:
        raise ConfigError(f"config file {path}: unknown section(s) {', '.join(unknown)}")
    return file_values


def _section(
    name: str,
    path: str | os.PathLike[str] | None,
    file_values: Mapping[str, Any],
    env: Mapping[str, str],
    overrides: Mapping[str, Mapping[str, Any]],
) -> Any:
    """One section from the file's values, then the environment's, then the flags'."""
    cls = next(f for f in fields(Config) if f.name == name).default_factory  # type: ignore[misc]
    values: dict[str, Any] = {}
    raw_file = file_values.get(name) or {}
    if not isinstance(raw_file, Mapping):
        raise ConfigError(f"config file {path}: section {name} must be a mapping")
    values.update(_section_values(cls, raw_file, lambda key: f"config file {path}: {name}.{key}"))
    prefix = f"FLEETLENS_{name.upper()}_"
    from_env = {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)}
    values.update(_section_values(cls, from_env, lambda key: f"environment {prefix}{key.upper()}"))
    flags = {k: v for k, v in overrides.get(name, {}).items() if v is not None}
    values.update(_section_values(cls, flags, lambda key: f"command line: {name}.{key}"))
    try:
        return cls(**values)
    except ConfigError as exc:
        origin = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{origin}: {exc}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the Config from the file at `path`, the environment and `overrides` ({section: {key: value}})."""
    file_values = _read_file(path)
    env = os.environ if env is None else env
    return Config(
        **{f.name: _section(f.name, path, file_values, env, overrides or {}) for f in fields(Config)}
    )


def load_exporter_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ExporterConfig:
    """The exporter's section alone, with the same precedence: a VM reads and checks only what it uses
    (a shared file's hub and alerting sections are the hub's to check), and loads no hub code."""
    env = os.environ if env is None else env
    return _section("exporter", path, _read_file(path), env, {"exporter": overrides or {}})


__all__ = [
    "AlertsConfig",
    "Config",
    "DrainConfig",
    "ExporterConfig",
    "GpuBackend",
    "HubConfig",
    "load_config",
    "load_exporter_config",
    "split_listen",
]
