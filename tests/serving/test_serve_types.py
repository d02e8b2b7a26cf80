"""gnll.serving is typed: no bare ``Any`` in its public signatures, ``handle(req, settings:
ServeSettings)`` in every service, and the request kind asked of the request, never of its class.
(``mypy`` checks the layer strictly in scripts/test.sh's lint step: ``[tool.mypy]`` in pyproject.toml.)"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import gnll.serving

SERVING = Path(gnll.serving.__file__).parent
ROOT = SERVING.parents[2]


def _bare_any(annotation: ast.expr | None) -> bool:
    """``Any``, or ``Any`` in a union (``Any | None``); ``dict[str, Any]`` says what it holds."""
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Constant):
        return annotation.value == "Any"
    if isinstance(annotation, ast.BinOp):
        return _bare_any(annotation.left) or _bare_any(annotation.right)
    return False


def _public_signatures(tree: ast.Module):
    """``(qualified name, parameter or "return", annotation)`` of every public function and method
    (``*args``/``**kwargs`` pass-throughs aside)."""

    def walk(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("_") and not node.name.startswith("__"):
                    continue
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    yield f"{prefix}{node.name}", arg.arg, arg.annotation
                yield f"{prefix}{node.name}", "return", node.returns

    yield from walk(tree.body, "")


def test_no_bare_any_in_public_signatures():
    found = [
        f"{path.relative_to(SERVING)}: {name}({param})"
        for path in sorted(SERVING.rglob("*.py"))
        for name, param, annotation in _public_signatures(ast.parse(path.read_text()))
        if _bare_any(annotation)
    ]
    assert not found, found


def test_the_checker_finds_a_bare_any():
    tree = ast.parse("def f(x: Any, y: dict[str, Any]) -> Any | None: ...\ndef _g(z: Any): ...")
    hits = [(n, p) for n, p, a in _public_signatures(tree) if _bare_any(a)]
    assert hits == [("f", "x"), ("f", "return")]


@pytest.mark.parametrize("module", ["inprocess", "proxy", "cascade"])
def test_every_service_handles_with_typed_settings(module):
    import importlib

    mod = importlib.import_module(f"gnll.serving.{module}")
    cls = next(
        c
        for c in vars(mod).values()
        if inspect.isclass(c) and c.__module__ == mod.__name__ and hasattr(c, "handle")
    )
    params = inspect.signature(cls.handle).parameters
    assert params["settings"].annotation == "ServeSettings"
    assert params["req"].annotation == "CompletionRequest | ChatCompletionRequest"


def test_the_request_kind_is_asked_of_the_request():
    """At most one ``isinstance(..., ChatCompletionRequest)`` in serving, and no body sniffing."""
    text = "\n".join(p.read_text() for p in SERVING.rglob("*.py"))
    assert len(re.findall(r"isinstance\([^)]*ChatCompletionRequest", text)) <= 1
    assert '"message" in body' not in text and "\"message\" in body['choices']" not in text


def test_mypy_is_pinned_and_configured_strict_for_serving():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'module = \["gnll\.serving", "gnll\.serving\.\*"', pyproject)
    # the decoding loop the engine queues for moved to the backends: still strict
    assert all(f'"gnll.backends.{m}"' in pyproject for m in ("decoding", "held", "early"))
    assert re.search(r"^mypy==", (ROOT / "constraints.txt").read_text(), re.M)
    assert "python -m mypy" in (ROOT / "scripts" / "test.sh").read_text()


def test_an_answers_logprobs_are_validated_once(monkeypatch):
    """One served answer: its record, G-NLL, LN-G-NLL and spans read one checked value
    (:class:`gnll.measures.logprobs.ValidLogprobs`); the check itself runs once."""
    import gnll.measures.logprobs as L
    from gnll.policy import AbstentionPolicy, Answer, annotate

    calls = []
    check = L._validate

    def counted(values, where, tokens):
        calls.append(where)
        return check(values, where, tokens)

    monkeypatch.setattr(L, "_validate", counted)
    tokens, lps = ["Paris", " is", " big", ".", " Or", " Lyon", "?"], [-0.1] * 6 + [5e-6]
    answer = Answer("Paris is big. Or Lyon?", "stop", tokens, lps, measured_logprobs=list(lps))
    [record], _, _ = annotate([answer], AbstentionPolicy(threshold=1.0), include_tokens=True)
    assert calls == ["model"]
    assert record.least_certain_span == "1" and record.token_logprobs[-1] == 0.0
    assert record.g_nll == pytest.approx(0.6) and record.abstain is False
    # an empty answer's G-NLL is its stop token's: a second sequence, checked once too
    calls.clear()
    empty = Answer("", "stop", [], [], measured_logprobs=[-2.5])
    [record], _, _ = annotate([empty], AbstentionPolicy(), include_tokens=False)
    assert calls == ["model", "model"] and record.g_nll == pytest.approx(2.5)
