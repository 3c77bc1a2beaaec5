"""Prometheus text format (0.0.4) whose HELP and TYPE lines carry the name the samples really have.

prometheus_client always writes a counter family's header as `<name>_total`. dcgm-exporter's counters
(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, DCGM_FI_DEV_PCIE_REPLAY_COUNTER) have no `_total`, so their header
would no longer match their samples and Prometheus would file them as untyped. Here a counter's header
takes the samples' form, as dcgm-exporter's own output does; everything else renders as prometheus_client
would. OpenMetrics output is left to prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_HEADER_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header_name(metric: Metric) -> str:
    if metric.type == "counter":
        bare = any(sample.name == metric.name for sample in metric.samples)
        return metric.name if bare else metric.name + "_total"
    if metric.type == "info":
        return metric.name + "_info"
    return metric.name


def render(families: Iterable[Metric]) -> bytes:
    """The text exposition of `families`, in order."""
    out: list[str] = []
    for metric in families:
        name = _header_name(metric)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {_HEADER_TYPE.get(metric.type, metric.type)}\n")
        for sample in metric.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels.items())
                out.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}")
            else:
                out.append(f"{sample.name} {floatToGoString(sample.value)}")
            if sample.timestamp is not None:
                out.append(f" {int(float(sample.timestamp) * 1000)}")
            out.append("\n")
    return "".join(out).encode()
