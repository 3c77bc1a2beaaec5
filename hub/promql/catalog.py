"""What the store holds, as Prometheus's HTTP API tells it: /api/v1/series, /api/v1/labels,
/api/v1/label/<name>/values, /api/v1/metadata and /api/v1/status/buildinfo.

`match[]` is a series selector parsed by promql_parser (hub.promql.plan), read with the matcher SQL that
queries use (hub.promql.sql.selector_where); the series of tables read as series (hub.promql.sql.SOURCES:
training steps, scrape outcomes) with a row in the window are listed with the stored ones. Prometheus's
default time range is all time; here a missing `start` is DEFAULT_WINDOW_S before `end` (now by default),
so that a request without times reads a bounded share of the store; the hub's query_max_rows (distinct
series) and query_max_seconds bound it further.

The store keeps no metric types, help or units: /api/v1/metadata names each metric stored in the window
with type "unknown" and empty help and unit.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
from collections.abc import Iterable

from collectors.logtext import printable
from hub.errors import PromQLError
from hub.promql.functions import LABEL_NAME
from hub.promql.plan import Selector, plan
from hub.promql.request import form_pairs, time_ms
from hub.promql.sql import SOURCES, Labels, Read, may_match, selector_where, series_labels, virtual_series_sql

DEFAULT_WINDOW_S = 24 * 3600  # how far back a request without `start` reads
VALUES_PATH = re.compile(r"/api/v1/label/([^/]+)/values")
PATHS = ("/api/v1/series", "/api/v1/labels", "/api/v1/metadata", "/api/v1/status/buildinfo")
EVERY_SERIES = Selector((("__name__", "=~", ".+"),), 0)  # what no match[] reads


def is_catalog_path(path: str) -> bool:
    """Whether `path` is one of the endpoints this module answers."""
    return path in PATHS or VALUES_PATH.fullmatch(path) is not None


def answer_catalog(
    path: str, method: str, query_string: str, content_type: str | None, body: bytes, read: Read, now: float
) -> bytes:
    """The JSON answer of a catalog endpoint (`is_catalog_path`); PromQLError (bad_data) naming a bad
    parameter."""
    if path == "/api/v1/status/buildinfo":
        return _success(build_info())
    pairs = form_pairs(method, query_string, content_type, body)
    values: dict[str, str] = {}
    for name, value in pairs:
        values.setdefault(name, value)
    end_ms = time_ms("end", values["end"]) if "end" in values else round(now * 1000)
    start_ms = time_ms("start", values["start"]) if "start" in values else end_ms - DEFAULT_WINDOW_S * 1000
    selectors = [_match(text) for name, text in pairs if name == "match[]"]
    if path == "/api/v1/metadata":
        return _success(_metadata(read, values, start_ms, end_ms))
    if path == "/api/v1/series":
        if not selectors:
            raise PromQLError("no match[] parameter provided")
        return _success([dict(labels) for labels in sorted(_series(read, selectors, start_ms, end_ms))])
    found = _series(read, selectors or [EVERY_SERIES], start_ms, end_ms)
    if path == "/api/v1/labels":
        return _success(sorted({name for labels in found for name, _ in labels}))
    label = _label_name(path)
    return _success(sorted({value for labels in found for name, value in labels if name == label}))


def build_info() -> dict[str, str]:
    """The fields of Prometheus's buildinfo, for this hub: its package's version."""
    return {
        "version": importlib.metadata.version("fleetlens"),
        "revision": "",
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
    }


def _label_name(path: str) -> str:
    match = VALUES_PATH.fullmatch(path)
    name = match.group(1) if match else ""
    if not LABEL_NAME.fullmatch(name):
        raise PromQLError(f"invalid label name: {printable(name)[:100]!r}")
    return name


def _match(text: str) -> Selector:
    """The series selector of one match[]; PromQLError naming it when it is anything else."""
    try:
        node = plan(text)
    except PromQLError as error:
        reason = str(error).removeprefix('invalid parameter "query": ')
        raise PromQLError(f'invalid parameter "match[]": {reason}') from None
    if not isinstance(node, Selector) or node.offset_ms or node.range_ms or node.at is not None:
        raise PromQLError(f'invalid parameter "match[]": {printable(text)[:100]!r} is not a series selector')
    return node


def _series(read: Read, selectors: Iterable[Selector], start_ms: int, end_ms: int) -> set[Labels]:
    """The label sets of the series any of `selectors` matches with a sample from start to end."""
    found: set[Labels] = set()
    for selector in selectors:
        rows = read(*_catalog_sql(selector, start_ms, end_ms, "metric, node, labels"))
        found.update(series_labels(metric, node, labels) for metric, node, labels in rows)
    return found


def _catalog_sql(selector: Selector, start_ms: int, end_ms: int, columns: str) -> tuple[str, dict]:
    """The SELECT of the distinct `columns` (of metric, node, labels) of the stored and virtual series
    `selector` matches with a sample from start to end, and its parameters."""
    where, parameters = selector_where(selector, start_ms, end_ms)
    sql = f"SELECT DISTINCT {columns} FROM metrics WHERE {where}"
    for source in SOURCES.values():
        if may_match(source, selector):
            sql += (
                f" UNION DISTINCT SELECT {columns} FROM ({virtual_series_sql(source, selector, parameters)})"
            )
    return sql, parameters


def _metadata(read: Read, values: dict[str, str], start_ms: int, end_ms: int) -> dict[str, list[dict]]:
    """Each stored metric (only `metric` when given), at most `limit` of them: types are not stored."""
    limit = -1
    if values.get("limit"):
        try:
            limit = int(values["limit"])
        except ValueError:
            raise PromQLError("limit must be a number") from None
    matchers = (("__name__", "=", values["metric"]),) if values.get("metric") else EVERY_SERIES.matchers
    rows = read(*_catalog_sql(Selector(matchers, 0), start_ms, end_ms, "metric"))
    names = sorted(metric for (metric,) in rows)[: limit if limit >= 0 else None]
    return {name: [{"type": "unknown", "help": "", "unit": ""}] for name in names}


def _success(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()
