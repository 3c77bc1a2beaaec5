"""Replaying a detector's scenario tests, for the tests that compare a detector's tape-read features with
the SQL they replaced: every scenario a test module has, run with its own fixtures."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import pytest


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
