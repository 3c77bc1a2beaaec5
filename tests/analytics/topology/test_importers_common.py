"""What every topology importer shares: the name allowlist, the input limit, the caller's host."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import AnalyticsError, TopologyError
from analytics.topology.importers import ibnetdiscover, k8s_nodes, libvirt, lldp, slurm
from analytics.topology.names import MAX_INPUT_CHARS, MAX_NAME_CHARS, caller_host, checked_name

PARSERS = {
    "slurm": slurm.parse,
    "k8s-nodes": k8s_nodes.parse,
    "ibnetdiscover": ibnetdiscover.parse,
    "lldp": functools.partial(lldp.parse, host="hv-01"),
    "libvirt": functools.partial(libvirt.parse, host="hv-01"),
}


def test_topology_error_is_an_analytics_error_naming_source_where_and_what() -> None:
    error = TopologyError("topology.conf", "line 3", "no SwitchName")
    assert isinstance(error, AnalyticsError)
    assert str(error) == "topology.conf: line 3: no SwitchName"
    assert (error.source, error.where, error.what) == ("topology.conf", "line 3", "no SwitchName")


@pytest.mark.parametrize(
    "name", ["leaf-07", "a08-p1-dgx-04-c01", "0000:3b:00.2", "x" * MAX_NAME_CHARS, "spine 1"]
)
def test_ordinary_names_pass(name: str) -> None:
    assert checked_name(name, source="s", where="w") == name


@pytest.mark.parametrize(
    ("name", "fault"),
    [
        ("", "empty"),
        ("x" * (MAX_NAME_CHARS + 1), "over"),
        ("leaf\n07", "control"),
        ("leaf\x1b[31m07", "control"),
        ("leaf\u202e70", "control"),  # a bidi override that would show the name reversed
        (" leaf", "whitespace"),
        (7, "text"),
        (None, "text"),
    ],
)
def test_bad_names_are_refused_with_where_they_were(name: object, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        checked_name(name, source="nodes.json", where="$.items[0].metadata.name")
    assert str(caught.value).startswith("nodes.json: $.items[0].metadata.name: ")


@given(st.text(min_size=1, max_size=20), st.characters(categories=["Cc", "Cf"]), st.text(max_size=20))
def test_any_name_holding_a_control_or_format_character_is_refused(head: str, bad: str, tail: str) -> None:
    with pytest.raises(TopologyError):
        checked_name(head + bad + tail, source="s", where="w")


def test_the_caller_host_is_the_argument_else_the_file_stem() -> None:
    assert caller_host("/var/spool/lldp/host-005.json", None) == "host-005"
    assert caller_host("virsh dumpxml vm-1", "hv-01") == "hv-01"
    with pytest.raises(TopologyError, match="host"):
        caller_host("x", "hv\x00")


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_every_importer_refuses_an_input_over_the_limit(fmt: str) -> None:
    with pytest.raises(TopologyError, match="over the limit") as caught:
        PARSERS[fmt](" " * (MAX_INPUT_CHARS + 1), "huge.txt")
    assert caught.value.source == "huge.txt"


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_every_importer_refuses_bytes_that_are_not_text(fmt: str) -> None:
    with pytest.raises(TopologyError, match="not text"):
        PARSERS[fmt](b"SwitchName=s0", "raw.bin")  # type: ignore[arg-type]
