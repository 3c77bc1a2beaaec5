"""Prometheus text format (0.0.4) whose HELP and TYPE lines carry the name the samples really have.

prometheus_client always writes a counter family's header as `<name>_total`. dcgm-exporter's counters
(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, DCGM_FI_DEV_PCIE_REPLAY_COUNTER) have no `_total`, so their header
would no longer match their samples and Prometheus would file them as untyped. Here a counter's header
takes the samples' form, as dcgm-exporter's own output does. Scrapes run every second on every VM, so
label strings are cached and values formatted without detours. OpenMetrics is left to prometheus_client.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_HEADER_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


_NEEDS_ESCAPE = frozenset('\\\n"')
_LABEL_CACHE_LIMIT = 50_000


def _escape_label(value: str) -> str:
    if _NEEDS_ESCAPE.isdisjoint(value):
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _LabelCache(dict):
    """Rendered `{k="v",...}` strings by label items: a scrape repeats each GPU's or port's labels in
    dozens of families, and the label sets stay the same from one scrape to the next."""

    def __missing__(self, items: tuple[tuple[str, str], ...]) -> str:
        if len(self) >= _LABEL_CACHE_LIMIT:
            self.clear()
        rendered = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in items) + "}"
        self[items] = rendered
        return rendered


_labels = _LabelCache()


def format_value(value: float) -> str:
    """A sample value as the text format spells it; integral values without a fraction (most counters)."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _header_name(metric: Metric) -> str:
    if metric.type == "counter":
        bare = any(sample.name == metric.name for sample in metric.samples)
        return metric.name if bare else metric.name + "_total"
    if metric.type == "info":
        return metric.name + "_info"
    return metric.name


def _render_family(metric: Metric) -> str:
    name = _header_name(metric)
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {name} {doc}\n# TYPE {name} {_HEADER_TYPE.get(metric.type, metric.type)}\n"]
    for sample in metric.samples:
        labels = _labels[tuple(sample.labels.items())] if sample.labels else ""
        out.append(f"{sample.name}{labels} {format_value(sample.value)}")
        if sample.timestamp is not None:
            out.append(f" {int(float(sample.timestamp) * 1000)}")
        out.append("\n")
    return "".join(out)


# The text of the last render's families by identity, each with its family: a collector that yields the
# very same family objects again (the gpu collector, between two reads of its GPUs) is rendered once.
# Holding the families keeps their ids from being reused; renders that race only miss the cache.
_last_rendered: dict[int, tuple[Metric, str]] = {}


def render(families: Iterable[Metric]) -> bytes:
    """The text exposition of `families`, in order. A family must not change once yielded."""
    global _last_rendered
    last, rendered, texts = _last_rendered, {}, []
    for metric in families:
        hit = last.get(id(metric))
        text = hit[1] if hit is not None and hit[0] is metric else _render_family(metric)
        rendered[id(metric)] = (metric, text)
        texts.append(text)
    _last_rendered = rendered
    return "".join(texts).encode()
