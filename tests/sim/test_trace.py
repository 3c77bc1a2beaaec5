"""sim.trace: the InfiniteHBD trace read as fault spans, every malformed event refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.errors import ScenarioError
from sim.trace import TRACE_FILE, TraceSpan, trace_spans


def write_trace(root: Path, events: object) -> Path:
    path = root / TRACE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(events))
    return root


def event(node: str, day: float, kind: str, desc: str = "Link Down") -> dict:
    return {"node_id": node, "event_time": day, "event_type": kind, "fault_type": {"Desc": desc}}


def test_the_real_trace_reads_as_one_span_per_start(fixtures: Path) -> None:
    spans = trace_spans(fixtures)
    events = json.loads((fixtures / TRACE_FILE).read_text())
    assert len(spans) == sum(e["event_type"] == "fault_start" for e in events)
    assert len({span.node for span in spans}) == 231
    assert all(span.end_day is None or span.end_day >= span.start_day for span in spans)


def test_starts_pair_with_the_next_end_of_the_same_node_and_description(tmp_path: Path) -> None:
    root = write_trace(
        tmp_path,
        [
            event("b", 5.0, "fault_end"),  # began before the trace: no start to place
            event("a", 1.0, "fault_start"),
            event("a", 2.0, "fault_start", "NIC Lost"),
            event("a", 3.0, "fault_end"),
            event("a", 4.0, "fault_start"),
        ],
    )
    assert trace_spans(root) == [
        TraceSpan("a", "Link Down", 1.0, 3.0),
        TraceSpan("a", "Link Down", 4.0, None),
        TraceSpan("a", "NIC Lost", 2.0, None),
    ]


@pytest.mark.parametrize(
    ("events", "words"),
    [
        ({"events": []}, "want a list of events"),
        (["x"], "event 0: want an object"),
        ([event("a", 1.0, "fault_start"), {**event("a", 2, "fault_end"), "node_id": ""}], "event 1: node_id"),
        ([event("a", 1.0, "fault_begin")], "event 0: event_type: 'fault_begin' is not one of"),
        ([{**event("a", 1.0, "fault_start"), "fault_type": "Link Down"}], "event 0: fault_type.Desc"),
        ([event("a", float("nan"), "fault_start")], "event 0: event_time"),
        ([event("a", -1.0, "fault_start")], "event 0: event_time"),
        ([{**event("a", 1.0, "fault_start"), "event_time": True}], "event 0: event_time"),
        ([{**event("a", 1.0, "fault_start"), "event_time": "1.0"}], "event 0: event_time"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_file_event_and_field(
    tmp_path: Path, events: object, words: str
) -> None:
    root = write_trace(tmp_path, events)
    with pytest.raises(ScenarioError, match=r"fault_trace\.json") as raised:
        trace_spans(root)
    assert words in str(raised.value)


def test_an_unreadable_trace_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="FLEETLENS_FIXTURES"):
        trace_spans(tmp_path / "nowhere")


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.floats(0, 400, allow_nan=False),
            st.sampled_from(("fault_start", "fault_end")),
            st.sampled_from(("Link Down", "NIC Lost")),
        ),
        max_size=40,
    )
)
def test_every_start_becomes_one_span_that_ends_after_it(tmp_path_factory, raw: list) -> None:
    root = write_trace(tmp_path_factory.mktemp("trace"), [event(n, d, k, desc) for n, d, k, desc in raw])
    spans = trace_spans(root)
    assert len(spans) == sum(kind == "fault_start" for _, _, kind, _ in raw)
    assert all(span.end_day is None or span.end_day >= span.start_day for span in spans)
