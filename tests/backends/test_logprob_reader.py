"""One module reads the servers' log-prob shapes: ``backends/openai/parse.py``.

A choice's ``logprobs`` comes in two shapes (``content[]`` entries, or the legacy parallel
``tokens`` / ``token_logprobs`` / ``top_logprobs`` lists). Every other module (the stream
reassembly, the reasoning split, the protocol shapes, the policy, the integrations) goes through
the reader's functions, so that a third shape, or a server's quirk, is handled in one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gnll.backends.openai.parse import (
    join_logprobs,
    logprob_entries,
    logprob_pairs,
    logprob_shape,
    logprobs_from,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "gnll"
READER = SRC / "backends" / "openai" / "parse.py"

#: The keys of a ``logprobs`` object that tell its shape.
SHAPE_KEYS = {"content", "tokens", "token_logprobs", "top_logprobs"}


def shape_reads(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads a shape key out of a log-prob object: ``x["content"]`` or
    ``x.get("tokens")`` where ``x`` is a log-prob object (its expression names ``logprobs`` or
    is ``lp``), and any read of ``token_logprobs`` (which nothing but that shape has)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            base, key = node.value, node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            base, key = node.func.value, node.args[0]
        else:
            continue
        if not (isinstance(key, ast.Constant) and key.value in SHAPE_KEYS):
            continue
        text = ast.unparse(base)
        if key.value == "token_logprobs" or "logprobs" in text or text == "lp":
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_check_sees_each_way_a_shape_is_read():
    source = """
a = lp.get("content")
b = choice["logprobs"]["tokens"]
c = (choice.get("logprobs") or {}).get("content") or []
d = row.get("token_logprobs")
e = message.get("content")      # a message's text: not a log-prob object
f = {"content": entries}        # written, not read
"""
    assert [line for line, _ in shape_reads(source)] == [2, 3, 4, 5]


def test_no_module_but_the_reader_reads_the_log_prob_shapes():
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {code}"
        for path in sorted(SRC.rglob("*.py"))
        if path != READER
        for line, code in shape_reads(path.read_text())
    ]
    assert offenders == [], "\n".join(offenders)


@pytest.mark.parametrize(
    "logprobs",
    [
        {"content": [{"token": "a", "logprob": -1.0, "top_logprobs": []}]},
        {"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": [{"a": -1.0}]},
    ],
    ids=["content", "legacy"],
)
def test_the_readers_agree_on_either_shape(logprobs):
    entries = logprob_entries(logprobs)
    assert [(e["token"], e["logprob"]) for e in entries] == logprob_pairs(logprobs) == [("a", -1.0)]
    assert logprob_shape(logprobs) in ("content", "legacy")
    # a stream's chunks joined give the whole choice's log-probs back, in the shape they came in
    whole = join_logprobs([logprobs_from(logprobs, 0), logprobs_from(logprobs, 1)])
    assert logprob_pairs(whole) == logprob_pairs(logprobs)
    assert logprob_shape(whole) == logprob_shape(logprobs)
