"""The check catalog: names and sets as `checks run --checks` takes them, and options a check needs."""

from __future__ import annotations

import pytest

from collectors.checks.catalog import CATALOG, SETS, CheckOptions, Weight, chosen
from collectors.errors import CollectorConfigError


def test_sets_expand_in_order_and_each_check_runs_once() -> None:
    assert chosen("light") == list(SETS["light"])
    assert chosen("ping, light ,ping") == ["ping", *SETS["light"]]


def test_an_unknown_name_is_refused_naming_it_and_what_is_known() -> None:
    with pytest.raises(CollectorConfigError, match=r"unknown check 'pnig'.*ping.*light \(set\)"):
        chosen("light,pnig")


def test_every_set_names_only_catalogued_checks_and_light_holds_no_heavy_check() -> None:
    for name, members in SETS.items():
        assert set(members) <= set(CATALOG), name
    assert all(CATALOG[name].weight is Weight.LIGHT for name in SETS["light"])


def test_a_check_missing_its_peers_refuses_before_running() -> None:
    with pytest.raises(CollectorConfigError, match="iperf3 needs at least one peer"):
        CATALOG["iperf3"].run(CheckOptions(node="vela-001"))
    with pytest.raises(CollectorConfigError, match="ping needs a device"):
        CATALOG["ping"].run(CheckOptions(node="vela-001", peers={"b": "127.0.0.1"}))
