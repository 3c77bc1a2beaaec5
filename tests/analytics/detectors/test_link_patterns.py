"""link_flap and link_down match a user's ignored_interfaces pattern as ClickHouse's `match` did (RE2), in
linear time (apart from test_links.py, whose scenarios test_tape_detectors.py replays through links())."""

from __future__ import annotations

import time

from analytics.detectors.links import IGNORED_INTERFACES, matcher
from analytics.store import Store


def test_a_configured_pattern_is_matched_as_clickhouse_matches_it_and_in_linear_time(store: Store):
    """A user's pattern, or a hostile interface name, cannot make Python backtrack for ever: the match is
    RE2's, the answers ClickHouse's `match` gives (searched, `.` taking a newline, UTF-8)."""
    hostile = "a" * 100_000 + "!"
    cases = [
        (r"^(a+)+$", hostile),
        (r"(a|aa)*b", hostile),
        (IGNORED_INTERFACES, "docker0"),
        (IGNORED_INTERFACES, "xdocker0"),
        (IGNORED_INTERFACES, "eth0"),
        (r"eth", "veth12"),
        (r"a.b", "a\nb"),
        (r"^.$", "ä"),
    ]
    started = time.monotonic()
    ours = [matcher(pattern)(name) for pattern, name in cases]
    assert time.monotonic() - started < 1.0  # Python's re would not finish the first case in a lifetime
    sql = "SELECT match({name:String}, {pattern:String})"
    theirs = [bool(store.query(sql, parameters={"name": n, "pattern": p}).rows[0][0]) for p, n in cases]
    assert ours == theirs == [False, False, True, False, False, True, True, True]
