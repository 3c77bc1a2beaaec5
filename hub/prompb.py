"""Prometheus's remote write and remote read messages (prometheus/prompb: types.proto, remote.proto), built
from their descriptors in one pool, so the real protobuf parser decodes them without generated code.

A series' labels are kept as their encoded Label messages (bytes, the same wire format), and only a series
not seen before has its labels decoded (and their UTF-8 checked) as Labels. Histograms are kept as raw
bytes: the hub counts and drops them; exemplars, metadata and read hints are skipped as unknown fields.
RawWriteRequest is WriteRequest with each TimeSeries left encoded, for the receiver's fast path.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "fleetlens.prompb"
_PROTO = descriptor_pb2.FieldDescriptorProto
_STRING, _INT32, _INT64 = _PROTO.TYPE_STRING, _PROTO.TYPE_INT32, _PROTO.TYPE_INT64
_MESSAGE, _BYTES = _PROTO.TYPE_MESSAGE, _PROTO.TYPE_BYTES
# name -> fields (name, number, type, message type or "", repeated)
_MESSAGES: dict[str, tuple[tuple[str, int, int, str, bool], ...]] = {
    "Label": (("name", 1, _STRING, "", False), ("value", 2, _STRING, "", False)),
    "Sample": (("value", 1, _PROTO.TYPE_DOUBLE, "", False), ("timestamp", 2, _INT64, "", False)),
    "TimeSeries": (
        ("labels", 1, _BYTES, "", True),
        ("samples", 2, _MESSAGE, "Sample", True),
        ("histograms", 4, _BYTES, "", True),
    ),
    "WriteRequest": (("timeseries", 1, _MESSAGE, "TimeSeries", True),),
    "RawWriteRequest": (("timeseries", 1, _BYTES, "", True),),
    "LabelMatcher": (
        ("type", 1, _INT32, "", False),
        ("name", 2, _STRING, "", False),
        ("value", 3, _STRING, "", False),
    ),
    "Query": (
        ("start_timestamp_ms", 1, _INT64, "", False),
        ("end_timestamp_ms", 2, _INT64, "", False),
        ("matchers", 3, _MESSAGE, "LabelMatcher", True),
    ),
    "ReadRequest": (
        ("queries", 1, _MESSAGE, "Query", True),
        ("accepted_response_types", 2, _INT32, "", True),
    ),
    "QueryResult": (("timeseries", 1, _MESSAGE, "TimeSeries", True),),
    "ReadResponse": (("results", 1, _MESSAGE, "QueryResult", True),),
}


def _message_classes() -> dict[str, type]:
    file = descriptor_pb2.FileDescriptorProto(
        name="fleetlens/prompb_remote.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            message.field.add(
                name=field_name,
                number=number,
                type=kind,
                type_name=f".{PACKAGE}.{type_name}" if type_name else None,
                label=_PROTO.LABEL_REPEATED if repeated else _PROTO.LABEL_OPTIONAL,
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _message_classes()
Label, Sample, TimeSeries = _CLASSES["Label"], _CLASSES["Sample"], _CLASSES["TimeSeries"]
WriteRequest, RawWriteRequest = _CLASSES["WriteRequest"], _CLASSES["RawWriteRequest"]
ReadRequest, ReadResponse = _CLASSES["ReadRequest"], _CLASSES["ReadResponse"]
