"""What a detector reports about an anomaly: one frozen dataclass per anomaly kind, and the one way it
crosses the store.

- EVIDENCE maps each anomaly kind to its class. Fields are the numbers and names that put the anomaly
  there, under the names the anomalies table's JSON has always used; a field typed `X | None` may be
  unknown (a NULL aggregate, a signal that did not fire). Every class has `windows`, the runner's count of
  windows in which the anomaly was found (None on a detector's finding, before the runner counts).
- to_json(evidence) is the table's `evidence` text: a JSON object of the fields, None fields left out,
  with "version" (the class's VERSION). A value JSON cannot carry (NaN, infinity) is an EvidenceError.
- from_json(kind, text) reads that text back and treats it as hostile: an unknown kind or version, text
  that is not a JSON object, a missing, extra or wrongly typed field, a non-finite number or nesting too
  deep is an EvidenceError naming the kind and the field. Text without "version" is version 1, the shape
  detectors wrote before evidence was versioned, so older stores keep reading.
- stored(kind, text) is from_json for readers that show what a store holds: a row it cannot read becomes
  Unreadable (its `error` says why), shown in place of the numbers, so one bad row never stops a page.
- as_dict(evidence) is the fields as plain values (lists, dicts; None left out) for readers that show
  evidence as a table cell or `name=value` text, never written back.

Only the store boundary calls to_json and from_json: analytics.detectors.runner.store_anomalies writes,
and each reader of the anomalies table converts the evidence column where its rows come in. Everything in
between (detectors, the runner, alerts, reports, the UI, sim's evaluation) holds the objects.
Standard library only: the alerting code imports this without pandas.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from analytics.errors import EvidenceError
from analytics.xid_catalog import Action

VERSION_KEY = "version"
MAX_TEXT_CHARS = 1_000_000  # stored evidence longer than this is refused unread


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Base of every kind's evidence."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    windows: int | None = None  # windows in which the anomaly was found; set by the runner


@dataclass(frozen=True, kw_only=True)
class Unreadable(Evidence):
    """Stored evidence a reader could not read (stored()): why, in words, shown in place of the numbers."""

    error: str


EVIDENCE: dict[str, type[Evidence]] = {}

Kind = TypeVar("Kind", bound=type[Evidence])


def _kind(name: str) -> Callable[[Kind], Kind]:
    """Class decorator: `cls` is the evidence of anomaly kind `name`."""

    def registered(cls: Kind) -> Kind:
        cls.KIND = name
        EVIDENCE[name] = cls
        return cls

    return registered


@_kind("slow_node")
@dataclass(frozen=True, kw_only=True)
class SlowNodeEvidence(Evidence):
    """A node slower than its stage's peers (analytics.detectors.slow_node); the GPU context only where the
    SM clock was the signal, the cost (job_slowdown, lost_gpu_hours) absent in older rows."""

    ratio: float  # the node's value over its peers' median
    signal: str  # compute_s, sm_clock_mhz or duration_s
    value: float
    peer_median: float
    z: float
    consistency: float
    peers: int
    steps: int
    stage: int
    job_step_s: float
    job_gpus: int
    lookback_s: float
    job_slowdown: float | None = None  # fraction of the job's step time due to the node, in [0, 1)
    lost_gpu_hours: float | None = None  # the cost so far (Detector.so_far)
    gpu_util_percent: float | None = None
    peer_gpu_util_percent: float | None = None
    power_w: float | None = None
    peer_power_w: float | None = None


@dataclass(frozen=True, kw_only=True)
class FeatureDeviation:
    """One feature that set a node apart from its peers: its value, their median and its z."""

    feature: str
    value: float | None = None
    peer_median: float | None = None
    z: float


@_kind("peer_outlier")
@dataclass(frozen=True, kw_only=True)
class PeerOutlierEvidence(Evidence):
    """A node an Isolation Forest isolates from its job's peers (analytics.detectors.peer_outlier)."""

    peers: int
    stage: int
    features: tuple[FeatureDeviation, ...]  # the features farthest from the peers, farthest first


@dataclass(frozen=True, kw_only=True)
class LinkState(Evidence):
    """A link's state as last seen: an interface's `carrier`, a port's IB `state` and `physical_state`."""

    carrier: float | None = None
    state: float | None = None
    physical_state: float | None = None


@_kind("link_flap")
@dataclass(frozen=True, kw_only=True)
class LinkFlapEvidence(LinkState):
    """A link up now that went down in the window or its lookback (analytics.detectors.links)."""

    downs: float | None = None
    # the increase of the port's link_downed counter (of an interface's carrier downs)
    link_downed: float | None = None
    state_falls: float | None = None
    lookback_s: float


@_kind("link_down")
@dataclass(frozen=True, kw_only=True)
class LinkDownEvidence(LinkState):
    """A link down the whole window (analytics.detectors.links)."""

    down_s: float | None = None


@_kind("congestion")
@dataclass(frozen=True, kw_only=True)
class CongestionEvidence(Evidence):
    """A port whose congestion signal stands out from the fabric's (analytics.detectors.congestion)."""

    signal: str
    ecn_marks_per_s: float | None = None
    cnp_sent_per_s: float | None = None
    cnp_handled_per_s: float | None = None
    transmit_wait_per_s: float | None = None
    fleet_median_per_s: float | None = None
    fleet_mad_per_s: float | None = None
    robust_z: float | None = None


@_kind("port_errors")
@dataclass(frozen=True, kw_only=True)
class PortErrorsEvidence(Evidence):
    """A port whose link corrupts what it carries (analytics.detectors.port_errors): the error counters
    that rose (`counters`, their rate names), each one's rate, the packets received and their ratio."""

    counters: tuple[str, ...]
    symbol_errors_per_s: float | None = None
    receive_errors_per_s: float | None = None
    link_recoveries_per_s: float | None = None
    received_packets_per_s: float | None = None
    errors_per_s: float | None = None
    errors_per_million: float | None = None  # errors per million packets received


@_kind("dma_degraded")
@dataclass(frozen=True, kw_only=True)
class DmaDegradedEvidence(Evidence):
    """A degraded DMA path (analytics.detectors.dma): the signals that fired, the numbers of each."""

    signals: tuple[str, ...]
    pcie_link: str | None = None  # "gen4 x8", with the pcie signal
    pcie_max_link: str | None = None
    pcie_replays: float | None = None
    roce_bytes_per_s: float | None = None  # these with the roce_bytes signal
    peers_roce_bytes_per_s: float | None = None
    roce_ratio: float | None = None
    ecn_marks_per_s: float | None = None
    transmit_wait_per_s: float | None = None
    peers: str | None = None
    nccl_ranks_without_gdr: tuple[str, ...] | None = None  # with the nccl signal


@_kind("gpu_throttle")
@dataclass(frozen=True, kw_only=True)
class GpuThrottleEvidence(Evidence):
    """A GPU (or every GPU of a node: gpus_throttled, components) whose SM clock fell below its peers'
    (analytics.detectors.gpu_throttle), with the reasons it gives and what to look at for each."""

    reasons: tuple[str, ...]
    reason_names: tuple[str, ...]
    look_at: tuple[str, ...]
    peers: str  # "busy GPUs" or "idle GPUs"
    sm_clock_mhz: float | None = None
    peers_sm_clock_mhz: float | None = None
    node_peers_sm_clock_mhz: float | None = None
    fleet_peers_sm_clock_mhz: float | None = None
    past_sm_clock_mhz: float | None = None
    clock_drop: float | None = None
    gpu_temp_c: float | None = None
    gpu_power_w: float | None = None
    gpu_util_percent: float | None = None
    gpus_throttled: int | None = None
    components: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class XidEvidence(Evidence):
    """The Xids of a window (per code, keyed by the code as text) and the action they recommend."""

    action: Action | None = None  # the most disruptive one the signals ask for; None in older rows
    action_text: str | None = None
    xid_codes: tuple[int, ...] | None = None
    xid_counts: Mapping[str, int] | None = None
    xid_causes: Mapping[str, str] | None = None
    xid_mnemonics: Mapping[str, str] | None = None
    pci_bus_id: str | None = None


@_kind("gpu_app_error")
@dataclass(frozen=True, kw_only=True)
class GpuAppErrorEvidence(XidEvidence):
    """Xids the application caused, alone (analytics.detectors.gpu_fault)."""


@_kind("gpu_fault")
@dataclass(frozen=True, kw_only=True)
class GpuFaultEvidence(XidEvidence):
    """A failed GPU (analytics.detectors.gpu_fault): the signals that fired and the numbers of each."""

    signals: tuple[str, ...]
    lost: str | None = None  # how it was found lost
    silent_scrapes: int | None = None
    row_remap_failure: float | None = None
    ecc_dbe_errors: float | None = None
    uncorrectable_remapped_rows: float | None = None


@_kind("shared_fault")
@dataclass(frozen=True, kw_only=True)
class SharedFaultEvidence(Evidence):
    """A fault of a shared layer (a leaf, spine, rail, host, rack) found from its children's per-node
    anomalies (analytics.topology.localize): k of its n active children anomalous in the window, against
    the fleet's base rate (K of N nodes), with the per-node anomalies it explains and what to check."""

    layer: str  # leaf, spine, rail, host, rack, pdu
    parent: str  # "leaf-07"
    n: int  # its active children
    k: int  # of them with a per-node anomaly in the window
    fleet_nodes: int  # N: the active nodes of the topology
    fleet_anomalous: int  # K: of them with a per-node anomaly
    p_value: float  # P(X >= k), X hypergeometric: n drawn from N of which K are anomalous
    log10_p_value: float  # the same in log10, finite where p_value underflows to 0
    tested: int  # parents tested in the window: the Bonferroni factor
    p_corrected: float  # min(1, p_value x tested)
    children: tuple[str, ...]  # the nodes below it, sorted (the n, but in a NIC layer: the NICs' nodes)
    anomalous_children: tuple[str, ...]  # the k, sorted ("<node>/<device>" NICs in a NIC layer)
    explains: tuple[str, ...]  # ids of the per-node anomalies it explains (no other fault explains them)
    kinds: Mapping[str, int]  # anomaly kind -> anomalous children with it
    dominant_kind: str  # the kind on most anomalous children
    check: str  # "leaf-07: link flaps on 4 of 4 nodes; check optics and switch logs"


def as_dict(evidence: Evidence) -> dict[str, Any]:
    """The fields as plain values, None left out: lists for tuples, text for an Action."""
    return {field.name: _plain(value) for field, value in _set_fields(evidence)}


def to_json(evidence: Evidence) -> str:
    """The anomalies table's evidence text, keys sorted; EvidenceError for a value JSON cannot carry."""
    try:
        return json.dumps(
            {VERSION_KEY: evidence.VERSION, **as_dict(evidence)}, sort_keys=True, allow_nan=False
        )
    except ValueError as error:
        raise EvidenceError(f"{evidence.KIND} evidence cannot be written: {error}") from error


def from_json(kind: str, text: str | bytes) -> Evidence:
    """The evidence of an anomaly of `kind` from its stored text; EvidenceError naming the kind and the
    field where the text is not evidence this code writes (see the module docstring)."""
    cls = EVIDENCE.get(kind)
    if cls is None:
        raise EvidenceError(
            f"unknown anomaly kind {kind!r}: no evidence class (known: {', '.join(EVIDENCE)})"
        )
    if not isinstance(text, str | bytes) or len(text) > MAX_TEXT_CHARS:
        raise EvidenceError(f"{kind} evidence: not text, or over {MAX_TEXT_CHARS:,} characters")
    try:
        parsed = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise EvidenceError(
            f"{kind} evidence is not JSON: {str(error)[:200] or type(error).__name__}"
        ) from error
    if not isinstance(parsed, dict):
        raise EvidenceError(f"{kind} evidence is not a JSON object but {type(parsed).__name__}")
    version = parsed.pop(VERSION_KEY, 1)
    if version != cls.VERSION or isinstance(version, bool):
        raise EvidenceError(f"{kind} evidence: unknown version {version!r} (this code reads {cls.VERSION})")
    return _decode_object(cls, parsed, kind)


def stored(kind: str, text: str | bytes) -> Evidence:
    """from_json for readers that show stored rows: Unreadable(error=why) instead of an EvidenceError."""
    try:
        return from_json(kind, text)
    except EvidenceError as error:
        return Unreadable(error=str(error))


def _set_fields(evidence: Any) -> list[tuple[dataclasses.Field, Any]]:
    pairs = [(field, getattr(evidence, field.name)) for field in dataclasses.fields(evidence)]
    return [(field, value) for field, value in pairs if value is not None]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {field.name: _plain(item) for field, item in _set_fields(value)}
    if isinstance(value, Action):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _decode_object(cls: type, values: dict[str, Any], where: str) -> Any:
    """An instance of dataclass `cls` from a JSON object: every key a field, every required field there."""
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    extra = sorted(set(values) - set(fields))
    if extra:
        raise EvidenceError(f"{where}: unknown field {extra[0]!r}")
    missing = [
        name for name, field in fields.items() if name not in values and field.default is dataclasses.MISSING
    ]
    if missing:
        raise EvidenceError(f"{where}: missing field {missing[0]!r}")
    return cls(**{name: _decode(value, hints[name], f"{where}.{name}") for name, value in values.items()})


def _optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _decode(value: Any, hint: Any, where: str) -> Any:
    """`value` (parsed JSON) as type `hint`; EvidenceError naming `where` (kind.field) when it is not."""
    if _optional(hint):
        if value is None:
            return None
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and isinstance(value, list):
        return tuple(_decode(item, args[0], f"{where}[{at}]") for at, item in enumerate(value))
    if origin is Mapping and isinstance(value, dict):
        return {key: _decode(item, args[1], f"{where}[{key!r}]") for key, item in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _decode_object(hint, value, where)
    if hint is Action and isinstance(value, str) and value in set(Action):
        return Action(value)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str) and type(value) is hint:
        return value
    raise EvidenceError(f"{where}: {_shown(value)} is not {getattr(hint, '__name__', hint)}")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
