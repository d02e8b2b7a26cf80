"""Correctness: SQuAD F1 and its normaliser, numbers, contains, judge replies, kappa."""

from __future__ import annotations

import pytest

from gnll.evaluation.results.correctness import (
    agreement,
    contains_match,
    f1_score,
    f1_verdict,
    max_f1,
    parse_judge_reply,
    parse_number,
)


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ("The Eiffel Tower", "eiffel tower", 1.0),  # case and article
        ("  an   Apple!!  ", "apple", 1.0),  # punctuation, white space, article "an"
        (
            "Theodore Roosevelt",
            "the roosevelt",
            2 * 1 * 0.5 / 1.5,
        ),  # "the" dropped; "Theodore" kept
        ("U.S.A.", "USA", 1.0),  # dots removed inside tokens
        ("rock-and-roll", "rock and roll", 0.0),  # hyphen removed, not split: one token
        ("", "", 1.0),
        ("", "Paris", 0.0),
        ("a an the", "Paris", 0.0),  # normalises to empty
        ("Paris Paris", "Paris", 2 * 0.5 * 1 / 1.5),  # repeated tokens count (Counter intersection)
        ("“Ulysses”", "Ulysses", 1.0),  # curly quotes are punctuation
    ],
)
def test_squad_f1_tricky(pred, gold, f1):
    assert f1_score(pred, gold) == pytest.approx(f1)


def test_max_f1_over_aliases_and_threshold():
    golds = ["Sir Henry Campbell-Bannerman", "Campbell Bannerman"]
    assert max_f1("Campbell Bannerman", golds) == 1.0
    v = f1_verdict("Henry Campbell", ["Henry Campbell Bannerman"])
    assert v.correct is True and v.score == pytest.approx(0.8)
    assert f1_verdict("Bannerman", ["Sir Henry Campbell Bannerman"]).correct is False  # F1 = 0.4


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("51", 51.0),
        ("51.0", 51.0),
        ("$51", 51.0),
        ("51 dollars.", 51.0),
        ("1,200 pages", 1200.0),
        ("-3", -3.0),
        ("Answer: 7", 7.0),
        ("The answer is 51", None),
        ("26 - 14 = 12", None),
        ("twelve", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_numeric_f1_for_svamp():
    assert f1_verdict("51.0", ["51"], 51.0).correct is True  # SQuAD F1 alone would say 0 ("510")
    assert f1_verdict("$51 dollars", ["51"], 51.0).correct is True
    assert f1_verdict("52", ["51"], 51.0).correct is False
    # not a number: falls back to token F1 against the formatted gold
    v = f1_verdict("He has 51 left", ["51"], 51.0)
    assert v.correct is False and v.detail is None


def test_contains():
    assert contains_match("It was painted by Leonardo da Vinci.", ["Da Vinci"]).correct
    assert not contains_match("Vincent", ["Vince"]).correct  # whole tokens only
    assert contains_match("The capital is Paris.", ["Lyon", "paris"]).correct
    assert contains_match("She sold 12 apples in total.", ["12"], 12.0).correct
    assert not contains_match("She sold 120 apples.", ["12"], 12.0).correct


@pytest.mark.parametrize(
    ("reply", "parsed"),
    [
        ("yes", "yes"),
        (" Yes.", "yes"),
        ("NO", "no"),
        ("no, it does not", "no"),
        ("**Yes**", "yes"),
        ("Response: no", "no"),
        ("Yes, no doubt about it", "yes"),
        ("I would say yes", "yes"),
        ("Not sure", "unparseable"),
        ("either yes or no", "unparseable"),
        ("", "unparseable"),
        ("nope", "unparseable"),
        ("Yesterday", "unparseable"),
    ],
)
def test_judge_reply_parsing(reply, parsed):
    assert parse_judge_reply(reply) == parsed


def test_agreement_and_kappa():
    a = [True, True, False, False, True, None]
    b = [True, False, False, False, True, True]
    res = agreement(a, b)
    assert res["n"] == 5
    assert res["agreement"] == pytest.approx(4 / 5)
    # hand computed: po = .8; pe = .6*.4 + .4*.6 = .48; kappa = (.8-.48)/.52
    assert res["kappa"] == pytest.approx((0.8 - 0.48) / 0.52)
    assert agreement([True, True], [True, True])["kappa"] is None
    assert agreement([None], [True])["n"] == 0
