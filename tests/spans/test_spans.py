"""gnll.spans: the spans and the unassigned tokens partition the answer's tokens and its NLL."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll.spans import Segment, json_segments, sentence_segments, span_nlls, token_positions

TEXT = st.lists(
    st.sampled_from(list("ab Zé. !?\n\"'") + ["日本", "😀", "…", "\u00a0", "Dr.", "e.g."]),
    max_size=60,
).map("".join)


@st.composite
def split(draw, text: str):
    """``text`` cut into tokens at random points (every token non-empty)."""
    cut_here = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    cuts = [c for c in range(1, len(text)) if cut_here[c]]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def logprobs(draw, n: int) -> list[float]:
    return draw(st.lists(st.floats(-30.0, 0.0), min_size=n, max_size=n))


def check_partition(report, lps) -> None:
    total = -math.fsum(lps)
    parts = math.fsum([s.nll for s in report.spans] + [report.unassigned_nll])
    assert abs(parts - total) <= 1e-9  # same path: float64 sums of the same log-probs
    assert abs(report.total_nll - total) <= 1e-9  # same path: float64 sums of the same log-probs
    assert sum(s.num_tokens for s in report.spans) + report.unassigned_tokens == len(lps)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_sentence_spans_partition_random_splits(data):
    text = data.draw(TEXT)
    toks = data.draw(split(text)) if text else []
    lps = logprobs(data.draw, len(toks))
    report = span_nlls(toks, lps, text, "sentence")
    check_partition(report, lps)
    for s in report.spans:
        assert text[s.start : s.end] == s.text and s.text == s.text.strip()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_partition_when_tokens_and_text_differ(data):
    """Stripped white space, a cut stop sequence and byte pieces decoded as U+FFFD."""
    core = data.draw(TEXT.filter(lambda s: s.strip()))
    text = core.strip()
    toks = [" "] + data.draw(split(core)) + ["\n\nQuestion:"]
    toks = [t.replace("😀", "\ufffd\ufffd") for t in toks]
    lps = logprobs(data.draw, len(toks))
    check_partition(span_nlls(toks, lps, text, "sentence"), lps)


LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.text(alphabet=st.sampled_from(list('ab "\\/é日😀\n{}[]:,')), max_size=8),
)
JSON = st.recursive(
    LEAF,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.dictionaries(st.text(alphabet='ab c.日"', max_size=4), kids, max_size=3),
    ),
    max_leaves=12,
).filter(lambda v: isinstance(v, (dict, list)))


def leaves(value, path="$"):
    if isinstance(value, dict):
        for k, v in value.items():
            p = (
                f"{path}.{k}"
                if k.isidentifier() and k.isascii()
                else f"{path}[{json.dumps(k, ensure_ascii=False)}]"
            )
            yield from leaves(v, p)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, value


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_json_spans_are_the_leaf_values_and_partition(data):
    value = data.draw(JSON)
    indent = data.draw(st.sampled_from([None, 2]))
    ascii_ = data.draw(st.booleans())
    text = "Answer: " + json.dumps(value, indent=indent, ensure_ascii=ascii_) + " done"
    segs = json_segments(text)
    want = list(leaves(value))
    assert [s.path for s in segs] == [p for p, _ in want]
    for s, (_, v) in zip(segs, want, strict=True):
        raw = text[s.start : s.end]
        got = json.loads(f'"{raw}"') if isinstance(v, str) else json.loads(raw)
        assert got == v
    toks = data.draw(split(text))
    lps = logprobs(data.draw, len(toks))
    report = span_nlls(toks, lps, text, "json")
    check_partition(report, lps)


def test_straddling_token_goes_where_most_of_its_characters_are():
    # "c. D" has c and . in sentence 1, D in sentence 2: sentence 1 gets it, flagged as straddling
    text = "abc. Def."
    r = span_nlls(["ab", "c. D", "ef."], [-1.0, -2.0, -4.0], text, "sentence")
    assert [(s.text, s.nll, s.num_tokens, s.straddling) for s in r.spans] == [
        ("abc.", 3.0, 2, 1),
        ("Def.", 4.0, 1, 0),
    ]
    # a leading space outside the sentence does not make a token straddle
    r = span_nlls(["abc.", " Def."], [-1.0, -4.0], text, "sentence")
    assert [s.straddling for s in r.spans] == [0, 0]
    # a tie (". D": '.' in one, 'D' in the other) goes to the earlier span
    r = span_nlls(["abc", ". D", "ef."], [-1.0, -2.0, -4.0], text, "sentence")
    assert [s.nll for s in r.spans] == [3.0, 4.0]


def test_json_keys_and_punctuation_are_unassigned():
    text = '{"city":"Paris","pop":2}'
    toks = ['{"', "city", '":"', "Par", "is", '","', "pop", '":', "2", "}"]
    lps = [-0.5, -1.0, -0.25, -3.0, -0.5, -0.125, -1.0, -0.25, -2.0, -0.0625]
    r = span_nlls(toks, lps, text, "json")
    assert [(s.path, s.text, s.nll, s.num_tokens) for s in r.spans] == [
        ("$.city", "Paris", 3.5, 2),
        ("$.pop", "2", 2.0, 1),
    ]
    assert r.unassigned_tokens == 7 and r.least_certain().path == "$.city"
    # a token that merges a quote with the value goes to the value (most of its characters)
    r = span_nlls(['{"city":', '"Paris', '"}'], [-1.0, -2.0, -3.0], '{"city":"Paris"}', "json")
    assert (r.spans[0].nll, r.spans[0].straddling) == (2.0, 1)


def test_nested_paths_and_empty_containers():
    text = '{"a": {"b": [1, {"c d": "x"}], "e": []}, "f": ""}'
    assert [(s.path, text[s.start : s.end]) for s in json_segments(text)] == [
        ("$.a.b[0]", "1"),
        ('$.a.b[1]["c d"]', "x"),
        ("$.f", ""),
    ]


def test_not_json_and_bad_logprobs_are_refused():
    with pytest.raises(ValueError, match="no JSON"):
        span_nlls(["Paris"], [-1.0], "Paris", "json")
    with pytest.raises(ValueError, match="non-finite log-prob"):
        span_nlls(["a"], [float("nan")], "a")
    with pytest.raises(ValueError, match="2 tokens but 1"):
        span_nlls(["a", "b"], [-1.0], "ab")


def test_sentence_rules():
    text = "It costs approx. three dollars. Mr. Smith paid 3.50 (cash). Done?! Yes…\n- item"
    assert [text[s.start : s.end] for s in sentence_segments(text)] == [
        "It costs approx. three dollars.",
        "Mr. Smith paid 3.50 (cash).",
        "Done?!",
        "Yes…",
        "- item",
    ]


def test_custom_segments_and_positions():
    r = span_nlls(["ab", "cd"], [-1.0, -2.0], "abcd", [Segment(2, 4, "tail")])
    assert (r.spans[0].nll, r.unassigned_nll) == (2.0, 1.0)
    assert token_positions(["\ufffd", "\ufffd", " ok"], "😀 ok") == [[0], [0], [1, 2, 3]]


def test_gnll_score_spans_sentence_and_json(tmp_path, monkeypatch):
    from fakes import ToyModel
    from typer.testing import CliRunner

    import gnll
    from gnll.cli.main import app

    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: ToyModel())
    inp = tmp_path / "in.jsonl"
    rows = [
        {"question": "q", "answer": "Paris is big. Rome is old?"},
        {"question": "q", "answer": '{"city": "Paris", "n": [1, 22]}'},
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for kind in ("sentence", "json"):
        out = tmp_path / f"{kind}.jsonl"
        res = CliRunner().invoke(
            app, ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--spans", kind]
        )
        assert res.exit_code == 0, res.output
        got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
        for r in got:
            if r["spans"] is None:
                assert kind == "json" and "no JSON" in r["spans_error"]
                continue
            total = sum(s["nll"] for s in r["spans"]) + r["unassigned_nll"]
            assert total == pytest.approx(r["nll"], abs=1e-9)  # same path: float64 sums of the same log-probs
            assert r["max_span_nll"] == max(s["nll"] for s in r["spans"])
    assert [s["text"] for s in got[1]["spans"]] == ["Paris", "1", "22"]
    assert [s["path"] for s in got[1]["spans"]] == ["$.city", "$.n[0]", "$.n[1]"]
    res = CliRunner().invoke(app, ["score", "-i", str(inp), "-o", "-", "--spans", "words"])
    assert res.exit_code == 2 and "--spans must be sentence or json" in res.output


def test_gnll_ask_spans(monkeypatch):
    from typer.testing import CliRunner

    import gnll
    from gnll.backends.base import Generation
    from gnll.cli.main import app

    toks = ['{"', "a", '":', " 1", ',"', "b", '":"', "x", '"}']
    lps = [-0.1, -0.2, -0.1, -1.5, -0.1, -0.3, -0.1, -0.25, -0.05]

    class Stand:
        name = "stand"

        def generate(self, prompts, config=None, **kw):
            return [[Generation("".join(toks), list(range(9)), toks, lps, "eos")]]

    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: Stand())
    res = CliRunner().invoke(app, ["ask", "Q?", "--json", "--spans", "json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)  # stderr says which model loads
    assert [(s["path"], s["nll"]) for s in rec["spans"]] == [("$.a", 1.5), ("$.b", 0.25)]
    # the span fields sit beside the measures, named as gnll score and gnll serve name them
    assert rec["least_certain_span"] == "$.a" and rec["spans_kind"] == "json"
    total = sum(s["nll"] for s in rec["spans"]) + rec["unassigned_nll"]
    assert total == pytest.approx(rec["g_nll"], abs=1e-9)  # same path: float64 sums of the same log-probs
    res = CliRunner().invoke(app, ["ask", "Q?", "--spans", "sentence"])
    assert res.exit_code == 0 and "NLL per sentence" in res.output
