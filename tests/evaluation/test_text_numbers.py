"""The one number grammar (gnll.text), shared by SVAMP correctness and the embedding number veto."""

from __future__ import annotations

import pytest

from gnll.evaluation.results.correctness import contains_match, parse_number
from gnll.text import as_number, numbers_in


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("4", [4.0]),
        ("four", []),
        ("1,000 people", [1000.0]),
        ("1,234,567.5", [1234567.5]),
        ("July 4, 1776", [4.0, 1776.0]),
        # signs
        ("-3 apples", [-3.0]),
        ("+3", [3.0]),
        ("it fell to -0.5 degrees", [-0.5]),
        ("(-3)", [-3.0]),
        ("x=-3", [-3.0]),
        ("26 - 14 = 12", [26.0, 14.0, 12.0]),  # a spaced minus is an operator
        ("26-14", [26.0, 14.0]),  # so is a minus after a digit
        ("a-3", [3.0]),
        # decimal commas, thousands separators and lists
        ("1,5 litres", [1.5]),
        ("0,25", [0.25]),
        ("1,50 €", [1.5]),
        ("1,500 pages", [1500.0]),
        ("1,2,3", [1.0, 2.0, 3.0]),
        (".5", [0.5]),
        ("12.", [12.0]),
    ],
)
def test_numbers_in(text, numbers):
    assert numbers_in(text) == numbers


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-3", -3.0),
        ("3.", 3.0),
        (" 1,5 ", 1.5),
        ("1,500", 1500.0),
        ("3 apples", None),
        ("1,2", 1.2),
    ],
)
def test_as_number(text, value):
    assert as_number(text) == value


def test_correctness_reads_signs_and_decimal_commas_like_the_veto():
    assert parse_number("-3") == -3.0 and parse_number("3") == 3.0
    assert parse_number("1,5 litres") == 1.5
    assert contains_match("It is -3 degrees", ["-3"], -3.0).correct is True
    assert contains_match("It is 3 degrees", ["-3"], -3.0).correct is False
    assert contains_match("About 1,5 litres", ["1.5"], 1.5).correct is True
