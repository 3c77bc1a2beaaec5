"""Hypothesis strategies shared by the property-based tests of what comes from outside."""

from __future__ import annotations

from hypothesis import strategies as st

JSON_VALUES = st.recursive(  # any JSON value, and integers at the edges of the store's columns and past them
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-1, 2**32, 2**63, 2**64, 10**400])
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
