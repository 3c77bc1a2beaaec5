"""Remote write requests as a Prometheus sends them, and a client that posts them to a hub."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence

import cramjam

from hub.prompb import Label, WriteRequest
from hub.remote_write import CONTENT_TYPE, VERSION

Series = tuple[Mapping[str, str], Sequence[tuple[int, float]]]  # labels with __name__, (ts ms, value)
HEADERS = {
    "Content-Type": CONTENT_TYPE,
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": VERSION,
}


def encode(series: Iterable[Series]) -> bytes:
    """The protobuf WriteRequest of `series`, labels sorted by name as Prometheus sends them."""
    request = WriteRequest()
    for labels, samples in series:
        one = request.timeseries.add()
        one.labels.extend(
            Label(name=name, value=value).SerializeToString() for name, value in sorted(labels.items())
        )
        for ts_ms, value in samples:
            sample = one.samples.add()
            sample.timestamp, sample.value = ts_ms, value
    return request.SerializeToString()


def snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def post(url: str, body: bytes, headers: Mapping[str, str] = HEADERS) -> tuple[int, bytes]:
    """POST `body` to the hub's /api/v1/write; (status, response body), 4xx and 5xx included."""
    request = urllib.request.Request(f"{url}/api/v1/write", data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
