"""The decision questions the ``gnll.decide`` / ``/v1/decisions`` tests ask (library, in-process,
proxy, real vLLM): one message and three questions, one of each type. The "deliv..." options of
``topic`` share their first tokens: only the whole text tells them apart."""

from __future__ import annotations

INPUT = "The parcel arrived two weeks late and the box was crushed."
QUESTIONS = [
    {"type": "predicate", "name": "late", "instructions": "Was the parcel late?"},
    {
        "type": "choice",
        "name": "topic",
        "instructions": "What is the message about?",
        "choices": [
            {"value": "delivery delay"},
            {"value": "delivery damage"},
            {"value": "billing"},
        ],
    },
    {
        "type": "score",
        "name": "anger",
        "instructions": "How angry is the writer?",
        "levels": [{"label": "Calm"}, {"label": "Annoyed"}, {"label": "Furious"}],
    },
]
