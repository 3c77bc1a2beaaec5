"""Values are written as Prometheus writes them (Go's strconv.FormatFloat(v, 'f', -1, 64)): the shortest
digits that read back as the value, never an exponent."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.promql.answer import number_text, number_texts


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (-0.0, "-0"),
        (0.1, "0.1"),
        (1e16, "10000000000000000"),
        (1.5e-5, "0.000015"),
        (-2.5e21, "-2500000000000000000000"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_values_read_as_prometheus_writes_them(value, text):
    assert number_text(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_value_reads_back_without_an_exponent(value):
    text = number_text(value)
    assert "e" not in text.lower()
    assert float(text) == value and math.copysign(1, float(text)) == math.copysign(1, value)


@given(st.lists(st.floats()))
def test_values_written_together_read_as_each_alone(values):
    assert number_texts(values) == [number_text(value) for value in values]
