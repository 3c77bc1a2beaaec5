"""Evidence for tests: one of a kind with the fields a test cares about (example), and Hypothesis strategies
of any evidence a kind's class can hold (evidence_of), both read from the classes' type hints so that a
field added to analytics.evidence needs no change here."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from analytics.evidence import EVIDENCE, Evidence
from analytics.xid_catalog import Action

ZEROS: Mapping[Any, Any] = {str: "", int: 0, float: 0.0, Action: Action.NONE}


def example(kind: str, **fields: Any) -> Evidence:
    """Evidence of `kind` with `fields`; every other required field a zero ("", 0, 0.0, (), {},
    Action.NONE)."""
    cls = EVIDENCE[kind]
    hints = typing.get_type_hints(cls)
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    empty = {tuple: (), Mapping: {}}  # a collection field: empty
    origin = {name: typing.get_origin(hints[name]) for name in required}
    zeros = {name: empty[origin[name]] if origin[name] in empty else ZEROS[hints[name]] for name in required}
    return cls(**{**zeros, **fields})


def evidence_of(cls: type) -> st.SearchStrategy[Any]:
    """Any instance of evidence class `cls` (or of a dataclass a field of one holds): every field set or
    None where it may be, numbers finite as JSON carries them."""
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{field.name: _values(hints[field.name]) for field in dataclasses.fields(cls)})


def _values(hint: Any) -> st.SearchStrategy[Any]:
    if isinstance(hint, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return st.none() | _values(inner)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        return st.lists(_values(args[0]), max_size=4).map(tuple)
    if origin is Mapping:
        return st.dictionaries(st.text(max_size=8), _values(args[1]), max_size=4)
    if dataclasses.is_dataclass(hint):
        return evidence_of(hint)
    if hint is Action:
        return st.sampled_from(Action)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    return st.from_type(hint)  # int, str
