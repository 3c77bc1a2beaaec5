"""The query API's limits in the hub's config: nonsense refused in one line naming the key, sense taken,
and the defaults the same as the ones the store and the hub use when none is configured."""

from __future__ import annotations

from dataclasses import fields

import pytest

from analytics.store.readonly import ReadLimits
from fleetlens.config import HubConfig, load_config
from fleetlens.errors import ConfigError
from hub.queryslots import QuerySlots


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hub: {query_max_seconds: 0}", "hub.query_max_seconds: must be between 1 and 3600, got 0"),
        ("hub: {query_max_seconds: -1}", "hub.query_max_seconds: must be between 1 and 3600, got -1"),
        ("hub: {query_max_seconds: .nan}", "hub.query_max_seconds: must be between 1 and 3600, got nan"),
        ("hub: {query_max_seconds: .inf}", "hub.query_max_seconds: must be between 1 and 3600, got inf"),
        ("hub: {query_max_rows: 1000000000000}", "hub.query_max_rows: must be between 1 and 1000000, got"),
        ("hub: {query_max_rows: 0}", "hub.query_max_rows: must be between 1 and 1000000, got 0"),
        ("hub: {query_max_memory_bytes: 1000}", "hub.query_max_memory_bytes: must be between 16777216"),
        ("hub: {query_max_rows_to_read: 0}", "hub.query_max_rows_to_read: must be between 1000"),
        ("hub: {query_max_bytes_to_read: 10}", "hub.query_max_bytes_to_read: must be between 1048576"),
        ("hub: {query_max_result_bytes: 0}", "hub.query_max_result_bytes: must be between 65536"),
        ("hub: {query_max_threads: 0}", "hub.query_max_threads: must be between 1 and 256, got 0"),
        ("hub: {query_slots: 0}", "hub.query_slots: must be between 1 and 16, got 0"),
        (
            "hub: {promql_max_samples: 10}",
            "hub.promql_max_samples: must be between 1000 and 1000000000, got 10",
        ),
        (
            "hub: {query_slots: 2, query_slots_per_client: 3}",
            "hub.query_slots_per_client: must be between 1 and 2",
        ),
        ("hub: {query_queue_s: -1}", "hub.query_queue_s: must be between 0 and 30, got -1"),
        (
            "hub: {query_max_seconds: 5, query_queue_s: 10}",
            "hub.query_queue_s: must be between 0 and 5, got 10",
        ),
        ("hub: {query_max_rows: 1.0e+12}", "hub.query_max_rows: expected int, got 1000000000000.0"),
    ],
)
def test_nonsense_query_limits_are_refused_in_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "fleetlens.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_query_limits_from_the_environment_are_checked_too():
    with pytest.raises(ConfigError, match=r"hub\.query_max_seconds: must be between 1 and 3600, got 0"):
        load_config(env={"FLEETLENS_HUB_QUERY_MAX_SECONDS": "0"})
    hub = load_config(env={"FLEETLENS_HUB_QUERY_MAX_MEMORY_BYTES": str(1 << 30)}).hub
    assert hub.query_max_memory_bytes == 1 << 30


def test_the_defaults_are_the_stores_and_the_hubs_own():
    """A hub started from config and one built in code (a test's, the simulator's) bound queries alike."""
    hub = HubConfig()
    assert {f"query_{field.name}": getattr(ReadLimits(), field.name) for field in fields(ReadLimits)} == {
        name: getattr(hub, name) for name in (f"query_{field.name}" for field in fields(ReadLimits))
    }
    slots = QuerySlots()
    assert (hub.query_slots, hub.query_slots_per_client, hub.query_queue_s) == (
        slots.total,
        slots.per_client,
        slots.queue_s,
    )
