"""The CLI's one key=value parser: values verbatim, converted only to the receiving parameter's type."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import typer

from gnll.cli._args import (
    clusterer_kwargs,
    coerce,
    model_kwargs,
    parse_csv,
    parse_kv,
    parse_list,
    typed_kwargs,
)


def test_parse_kv_keeps_values_verbatim():
    assert parse_kv("device=cpu, batch_size=8,,x=1.5,key=1e3,url=http://h:1/v1?a=b") == {
        "device": "cpu",
        "batch_size": "8",
        "x": "1.5",
        "key": "1e3",
        "url": "http://h:1/v1?a=b",  # only the first '=' splits
    }
    assert parse_kv(None) == {} == parse_kv("")
    for bad in ("novalue", "=x"):
        with pytest.raises(typer.BadParameter, match="key=value"):
            parse_kv(bad, "--judge_args")


def test_parse_csv_and_list():
    assert parse_csv(" a, b,,c ") == ["a", "b", "c"]
    assert parse_csv(None) is None and parse_csv(" , ") is None
    assert parse_list("1, 2", int, "--lengths") == (1, 2)
    assert parse_list("0.5,1", float, "--t") == (0.5, 1.0)
    with pytest.raises(typer.BadParameter, match="expected an integer, got 'x'"):
        parse_list("1,x", int, "--lengths")
    with pytest.raises(typer.BadParameter, match="empty list"):
        parse_list(",", int, "--lengths")


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        ("8", int, 8),
        ("1e3", float, 1000.0),
        ("1e3", str, "1e3"),
        ("1e3", Any, "1e3"),
        ("False", bool, False),
        ("yes", bool, True),
        ("none", int | None, None),
        ("7", int | None, 7),
        ("true", bool | str | None, True),
        ("maybe", bool | str | None, "maybe"),
        ("0.5", float | None, 0.5),
        ("chat", Literal["auto", "chat"], "chat"),
    ],
)
def test_coerce_follows_the_annotation(value, annotation, expected):
    out = coerce(value, annotation)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(
    ("value", "annotation", "message"),
    [
        ("8.5", int, "expected an integer"),
        ("many", float, "expected a number"),
        ("maybe", bool, "expected true or false"),
        ("x", Literal["a", "b"], "expected one of a, b"),
        ("x", int | None, "expected none, got 'x' or expected an integer"),
    ],
)
def test_coerce_rejects_what_does_not_fit(value, annotation, message):
    with pytest.raises(ValueError, match=message):
        coerce(value, annotation)


def test_typed_kwargs_uses_the_first_target_that_declares_a_key():
    def outer(name: str, *, backend: str = "hf", **kwargs: Any) -> None: ...

    class Inner:
        def __init__(self, *, batch_size: int = 1, chat: bool | None = None, api_key: str = ""):
            pass

    raw = {"backend": "x", "batch_size": "8", "chat": "false", "api_key": "123", "other": "1.5"}
    assert typed_kwargs(raw, outer, Inner) == {
        "backend": "x",
        "batch_size": 8,
        "chat": False,
        "api_key": "123",  # a string parameter keeps digits as text
        "other": "1.5",  # declared nowhere: left to the receiver, verbatim
    }
    with pytest.raises(typer.BadParameter, match="batch_size: expected an integer"):
        typed_kwargs({"batch_size": "big"}, Inner, option="--model_args")


def test_model_kwargs_types_by_backend():
    hf = model_kwargs("device=cpu,batch_size=8,chat_template=false,max_batch_tokens=none")
    assert hf == {
        "device": "cpu",
        "batch_size": 8,
        "chat_template": False,
        "max_batch_tokens": None,
    }
    server = model_kwargs("backend=openai,base_url=http://h/v1,api_key=1e3,concurrency=4")
    assert server == {
        "backend": "openai",
        "base_url": "http://h/v1",
        "api_key": "1e3",
        "concurrency": 4,
    }


def test_clusterer_kwargs_types_by_clusterer():
    assert clusterer_kwargs("embedding", "threshold=0.9,include_question=yes,batch_size=8") == {
        "threshold": 0.9,
        "include_question": True,
        "batch_size": 8,
    }
    assert clusterer_kwargs("nli", "condition_on_question=no,model=x") == {
        "condition_on_question": False,
        "model": "x",
    }
