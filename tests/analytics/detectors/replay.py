"""The tape-versus-SQL check: a detector's tape-read features compared, call by call, with the frame of the
ClickHouse SQL they replaced (kept in its test as the reference), over every scenario of a detector's tests
replayed with their own fixtures."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from analytics.detectors.base import Window, frame
from analytics.detectors.counters import LOOKBACK_S, MAX_CANDIDATES, series_parameters
from analytics.store.protocols import Reader


def scenarios(*modules: ModuleType, mentioning: Mapping[ModuleType, str] | None = None) -> list[Any]:
    """A pytest.param per test function of `modules`, id "<module>.<test>"; of a module in `mentioning`,
    only the tests whose source names its text (a detector's class, in a module testing several)."""
    wanted = mentioning or {}
    return [
        pytest.param(function, id=f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
        for module in modules
        for name, function in vars(module).items()
        if name.startswith("test_")
        and inspect.isfunction(function)
        and (module not in wanted or wanted[module] in inspect.getsource(function))
    ]


def play(scenario: Callable[..., None], request: pytest.FixtureRequest, **given: Any) -> None:
    """Run `scenario` with the fixtures its parameters name, or the `given` value of a parameter that is
    no fixture."""
    parameters = inspect.signature(scenario).parameters
    scenario(**{name: given[name] if name in given else request.getfixturevalue(name) for name in parameters})


def series_sql_frame(
    source: Reader,
    sql: str,
    metrics: Sequence[str],
    window: Window,
    lookback_s: float = LOOKBACK_S,
    **parameters: Any,
) -> pd.DataFrame:
    """The frame of reference SQL built on counters.series_sql, read for `metrics` over `window` with
    `lookback_s` of history (and any further query `parameters`)."""
    bound = series_parameters(metrics, window.start, window.end, lookback_s) | parameters
    return frame(source.query(sql, parameters=bound, max_rows=MAX_CANDIDATES))


def assert_same_frame(new: pd.DataFrame, old: pd.DataFrame) -> None:
    """The same columns, rows, order and values; an empty frame's columns alone (SQL's come untyped).
    Text is text whether pandas holds it as Python strings or Arrow's (the tape keeps Python strings);
    every other dtype must match."""
    if old.empty:
        assert new.empty and list(new.columns) == list(old.columns)
    else:
        pd.testing.assert_frame_equal(text_as_objects(new), text_as_objects(old), check_exact=True)


def text_as_objects(columns: pd.DataFrame) -> pd.DataFrame:
    """`columns` with its text as Python strings (object columns) wherever pandas holds Arrow strings."""
    text = [name for name, dtype in columns.dtypes.items() if isinstance(dtype, pd.StringDtype)]
    return columns.astype(dict.fromkeys(text, object)) if text else columns


class Compared:
    """A features function that, on each call, also runs the `old` one (the reference SQL) with the same
    arguments and asserts both frames the same; it keeps the frames it compared."""

    def __init__(self, new: Callable[..., pd.DataFrame], old: Callable[..., pd.DataFrame]) -> None:
        self._new, self._old = new, old
        self.frames: list[pd.DataFrame] = []

    def __call__(self, *args: Any) -> pd.DataFrame:
        new = self._new(*args)
        assert_same_frame(new, self._old(*args))
        self.frames.append(new)
        return new

    @property
    def rows(self) -> int:
        """How many rows the compared frames held: none means the check compared nothing."""
        return sum(len(compared) for compared in self.frames)


def compare(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, old: Callable[..., pd.DataFrame]
) -> Compared:
    """Put a Compared of `owner.name` and `old` in its place for the test; the Compared."""
    check = Compared(getattr(owner, name), old)
    monkeypatch.setattr(owner, name, check)
    return check


def play_compared(
    scenario: Callable[..., None], request: pytest.FixtureRequest, *checks: Compared, **given: Any
) -> None:
    """Play `scenario` (see `play`) under `checks` and assert that they compared some rows."""
    play(scenario, request, **given)
    assert sum(check.rows for check in checks) > 0
