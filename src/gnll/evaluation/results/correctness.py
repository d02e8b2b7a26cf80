"""Correctness of a reference answer: SQuAD F1, substring containment, LLM-as-a-judge.

Every metric returns a :class:`Verdict` with ``correct`` in ``{True, False, None}``; ``None`` means
the
metric could not decide (an unparseable judge reply) and the question is left out of that metric's
evaluation instead of being silently counted as wrong.

Examples
--------
>>> f1_score("the Eiffel Tower", "Eiffel Tower, Paris")
0.8
>>> parse_judge_reply(" Yes, it does.")
'yes'
>>> parse_judge_reply("maybe")
'unparseable'
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gnll.text import NUMBER, answer_tokens, as_number, normalize_answer, numbers_in

__all__ = [
    "PAPER_METRICS",
    "CORRECTNESS_METRICS",
    "F1_RULES",
    "F1_THRESHOLD",
    "Verdict",
    "agreement",
    "contains_match",
    "f1_rule_disagreements",
    "judge_index",
    "judge_metric",
    "f1_score",
    "f1_verdict",
    "max_f1",
    "parse_judge_reply",
    "parse_number",
]

CORRECTNESS_METRICS = ("f1", "contains", "judge")
#: Metrics the paper reports (Table 1: F1 and the LLM judge); Contains is gnll's stand-in without a
#: judge and stays out of the overall average when a paper metric scores the same task.
PAPER_METRICS = ("f1", "judge")


def judge_metric(index: int) -> str:
    """The correctness metric of the ``index``-th judge (``--judge A,B``): ``judge``, ``judge2``, ...

    >>> [judge_metric(i) for i in range(3)]
    ['judge', 'judge2', 'judge3']
    """
    return "judge" if index == 0 else f"judge{index + 1}"


def judge_index(metric: str) -> int | None:
    """The judge a metric belongs to (0 for ``judge``), or ``None`` for a metric without a judge.

    >>> judge_index("judge"), judge_index("judge2"), judge_index("f1")
    (0, 1, None)
    """
    if metric == "judge":
        return 0
    if metric.startswith("judge") and metric[5:].isdigit() and int(metric[5:]) >= 2:
        return int(metric[5:]) - 1
    return None


F1_THRESHOLD = 0.5
#: How an F1 score is compared with :data:`F1_THRESHOLD`: ``"gt"`` is the paper's rule (F1 "exceeds
#: 0.5", Sec. 5 and Table 1's caption), ``"ge"`` the reference code's (``f1 >= 50``).
F1_RULES = ("gt", "ge")


@dataclass
class Verdict:
    """Outcome of one correctness metric for one answer."""

    correct: bool | None
    score: float | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "correct"}


# --------------------------------------------------------------------------------------------- F1
def f1_score(prediction: str, gold: str) -> float:
    """SQuAD v1.1 token F1 between two strings (after :func:`gnll.text.normalize_answer`).

    Two empty answers score 1; one empty answer scores 0.
    """
    p, g = answer_tokens(prediction), answer_tokens(gold)
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def max_f1(prediction: str, golds: Sequence[str]) -> float:
    """Maximum F1 over the gold aliases."""
    if not golds:
        raise ValueError("no gold answers")
    return max(f1_score(prediction, g) for g in golds)


# ----------------------------------------------------------------------------------------- numbers
# The number grammar is gnll.text's (the embedding clusterer's number veto reads numbers the same way).
_WHOLE_NUM_RE = re.compile(
    rf"^\s*(?:answer\s*[:=]?\s*)?[$€£]?\s*(?P<num>{NUMBER})\s*(?:%|[a-zA-Z][a-zA-Z .']*)?\.?\s*$",
    flags=re.IGNORECASE,
)


def parse_number(text: str) -> float | None:
    """The number an answer *is*, or ``None``.

    An answer is a number if, apart from a currency sign, thousands separators, a trailing period
    and trailing unit words, it consists of one number: ``"51"``, ``"$51.00"``, ``"51 dollars."``,
    ``"1,200 pages"``. ``"The answer is 51"`` or ``"26 - 14 = 12"`` are not numbers.

    >>> parse_number("$1,200.50 dollars."), parse_number("12 apples"), parse_number("26 - 14 = 12")
    (1200.5, 12.0, None)
    """
    m = _WHOLE_NUM_RE.match(text)
    return as_number(m.group("num")) if m else None


def _num_equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def _passes(score: float, rule: str) -> bool:
    if rule == "gt":
        return score > F1_THRESHOLD
    if rule == "ge":
        return score >= F1_THRESHOLD
    raise ValueError(f"unknown F1 rule {rule!r}; choose from {F1_RULES} ('gt' is the paper's)")


def f1_verdict(
    prediction: str, golds: Sequence[str], numeric_gold: float | None = None, rule: str = "gt"
) -> Verdict:
    """``f1``: max-over-aliases SQuAD F1 above 0.5; numeric equality when both sides are numbers.

    ``rule="gt"`` (default) is the paper's "F1 exceeds 0.5"; ``rule="ge"`` the reference code's
    ``>= 0.5``. They disagree exactly when the F1 is 0.5, e.g. "Kennedy" for "John F. Kennedy":

    >>> f1_verdict("Kennedy", ["John F. Kennedy"]).correct
    False
    >>> f1_verdict("Kennedy", ["John F. Kennedy"], rule="ge").correct
    True
    """
    if rule not in F1_RULES:
        raise ValueError(f"unknown F1 rule {rule!r}; choose from {F1_RULES} ('gt' is the paper's)")
    if numeric_gold is not None:
        value = parse_number(prediction)
        if value is not None:
            ok = _num_equal(value, numeric_gold)
            return Verdict(ok, 1.0 if ok else 0.0, "numeric")
    score = max_f1(prediction, golds)
    return Verdict(_passes(score, rule), score, None)


def f1_rule_disagreements(verdicts: Sequence[dict[str, Any]]) -> int:
    """How many ``f1`` verdicts (``Verdict.to_dict()``) the rules ``gt`` and ``ge`` label differently.

    Numeric verdicts (SVAMP) do not depend on the rule.

    >>> f1_rule_disagreements([{"correct": False, "score": 0.5}, {"correct": True, "score": 1.0},
    ...                        {"correct": False, "score": 0.0, "detail": "numeric"}])
    1
    """
    return sum(
        1
        for v in verdicts
        if v.get("detail") != "numeric"
        and v.get("score") is not None
        and _passes(v["score"], "gt") != _passes(v["score"], "ge")
    )


def contains_match(
    prediction: str, golds: Sequence[str], numeric_gold: float | None = None
) -> Verdict:
    """``contains``: a normalised gold alias is a whole-token span of the normalised answer.

    For numeric gold answers any number in the answer equal to the gold counts.

    >>> contains_match("It was painted by Leonardo da Vinci.", ["Da Vinci"]).correct
    True
    >>> contains_match("Vincent", ["Vince"]).correct
    False
    """
    if numeric_gold is not None:
        ok = any(_num_equal(v, numeric_gold) for v in numbers_in(prediction))
        return Verdict(ok, float(ok), "numeric")
    hay = f" {normalize_answer(prediction)} "
    for g in golds:
        ng = normalize_answer(g)
        if ng and f" {ng} " in hay:
            return Verdict(True, 1.0, g)
    return Verdict(False, 0.0, None)


# ------------------------------------------------------------------------------------------- judge
_WORD_RE = re.compile(r"[a-z]+")


def parse_judge_reply(reply: str) -> str:
    """Map a judge's reply to ``"yes"``, ``"no"`` or ``"unparseable"``.

    The first word decides if it is yes/no (``"Yes."``, ``"**No**, because..."``,
    ``"Response: yes"``); otherwise the reply counts only if exactly one of yes/no occurs in it.

    >>> replies = ["no", "NO!", "Yes, no doubt", "I think yes", "Either yes or no", ""]
    >>> [parse_judge_reply(r) for r in replies]
    ['no', 'no', 'yes', 'yes', 'unparseable', 'unparseable']
    """
    words = _WORD_RE.findall(reply.lower())
    while words and words[0] in ("response", "answer", "a"):
        words = words[1:]
    if not words:
        return "unparseable"
    if words[0] in ("yes", "no"):
        return words[0]
    has_yes, has_no = "yes" in words, "no" in words
    if has_yes != has_no:
        return "yes" if has_yes else "no"
    return "unparseable"


def judge_verdict(reply: str) -> Verdict:
    parsed = parse_judge_reply(reply)
    return Verdict({"yes": True, "no": False}.get(parsed), None, parsed)


# --------------------------------------------------------------------------------------- agreement
def agreement(a: Sequence[bool | None], b: Sequence[bool | None]) -> dict[str, Any]:
    """Agreement rate and Cohen's kappa of two correctness metrics on the questions both decided.

    >>> agreement([True, False, True, None], [True, False, False, True])["n"]
    3
    """
    from sklearn.metrics import cohen_kappa_score

    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    n = len(pairs)
    if n == 0:
        return {"n": 0, "agreement": None, "kappa": None}
    xs = [int(x) for x, _ in pairs]
    ys = [int(y) for _, y in pairs]
    agree = sum(x == y for x, y in pairs) / n
    if len(set(xs) | set(ys)) < 2:
        kappa = None  # both raters constant and equal: kappa is undefined
    else:
        k = float(cohen_kappa_score(xs, ys))
        kappa = None if math.isnan(k) else k
    return {"n": n, "agreement": agree, "kappa": kappa}
