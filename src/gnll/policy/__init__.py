"""The abstention policy: one library object that turns an answer into what the caller gets.

Every surface obeys the same :class:`AbstentionPolicy`: ``gnll serve`` (in-process, proxy and the
escalation cascade), ``gnll generate`` and the four framework integrations. The policy

- checks itself when it is built (:class:`~gnll._util.validation.ParameterError` naming the
  parameter: ``refuse``, ``flag`` or ``escalate`` without a rule, a ``refuse`` rule that refuses
  every answer, a calibration fitted on other answers than the model's ``scored`` ones);
- :meth:`~AbstentionPolicy.pin` pins a request to what it decides on (greedy decoding, log-probs);
- :meth:`~AbstentionPolicy.decide` turns one :class:`Answer` into its :class:`Decided`: the
  ``uncertainty`` record and the text and finish reason the caller sees;
- :meth:`~AbstentionPolicy.wrap` / :meth:`~AbstentionPolicy.awrap` hold a stream until the answer is
  decided when the policy may withhold it, so no byte of a refused answer precedes the refusal;
- :func:`kept` and :func:`escalated` write the escalation fields of a cascade's records.

It sits below ``gnll.scoring`` and ``gnll.serving`` (it reads calibrations, so it sits above
:mod:`gnll.calibration`), so every surface can import it.

G-NLL is defined for the *greedy* answer: ``-sum_t log p(y_t | x, y_<t)`` along the greedy path. For
a sampled answer the same sum is the NLL of that sample, a different quantity (it grows with the
temperature's randomness, not only with the model's uncertainty), so it is reported as ``nll`` with
``decoding: "sampled"`` and ``g_nll: null``, and no abstention decision is taken on it.

Examples
--------
>>> policy = AbstentionPolicy(threshold=2.0)
>>> u = uncertainty_record([-0.1, -0.2], decoding="greedy", policy=policy)
>>> round(u.g_nll, 3), u.num_tokens, u.abstain
(0.3, 2, False)
>>> uncertainty_record([-0.1, -3.0], decoding="sampled", policy=policy).g_nll is None
True
>>> refuse = AbstentionPolicy(mode="refuse", threshold=1.0)
>>> d = refuse.decide(Answer(" Lyon", "stop", [" Lyon"], [-4.0]))
>>> d.refused, d.text
(True, 'I am not confident enough to answer this.')
>>> list(refuse.wrap(iter([" Ly", "on"]), lambda held: ["<refusal>"]))
['<refusal>']
"""

from gnll.policy.abstention import DEFAULT_REFUSAL, MODES, AbstentionPolicy, Mode
from gnll.policy.answers import (
    Answer,
    Decided,
    add_early,
    annotate,
    answer_spans,
    apply_policy,
    escalated,
    headers_for,
    kept,
    reasoning_fields,
    scored_of,
    uncertainty_record,
)

__all__ = [
    "DEFAULT_REFUSAL",
    "MODES",
    "AbstentionPolicy",
    "Answer",
    "Decided",
    "Mode",
    "add_early",
    "annotate",
    "answer_spans",
    "apply_policy",
    "escalated",
    "headers_for",
    "kept",
    "reasoning_fields",
    "scored_of",
    "uncertainty_record",
]
