"""Semantic clustering: the exact clusterer, the partition algorithm, the registry, and
SE/D-SE/MCP end to end. Model-backed clusterers: ``test_semantic_{embedding,nli,llm}.py``."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll import measures
from gnll.semantic import (
    CLUSTERERS,
    ExactClusterer,
    PairwiseClusterer,
    canonical_variant,
    dedupe_answers,
    equivalent,
    first_appearance_ids,
    leader_partition,
    leader_partition_many,
    load_clusterer,
)
from gnll.text import normalize_answer

Q = "What is the capital of France?"


# --------------------------------------------------------------------------------------------------
# helpers


def is_first_appearance(ids: list[int]) -> bool:
    """Ids are 0..k-1 and each new id is exactly one more than the largest seen so far."""
    top = -1
    for i in ids:
        if i > top + 1 or i < 0:
            return False
        top = max(top, i)
    return True


def as_partition(ids: list[int], keys: list) -> frozenset:
    """The partition as a set of blocks of ``keys`` (order- and label-free)."""
    blocks: dict[int, set] = {}
    for i, k in zip(ids, keys, strict=True):
        blocks.setdefault(i, set()).add(k)
    return frozenset(frozenset(b) for b in blocks.values())


class RuleClusterer(PairwiseClusterer):
    """A pairwise clusterer with a scripted directional relation, recording what it was asked.

    ``rule(question, premise, hypothesis) -> label``.
    """

    name = "rule"

    def __init__(self, rule, relation="strict"):
        super().__init__(relation)
        self.rule = rule
        self.calls: list[list[tuple[str, str, str]]] = []

    def _predict_directional(self, triples):
        self.calls.append(list(triples))
        return [self.rule(q, a, b) for q, a, b in triples]


def same_first_word(q, a, b):
    return "entailment" if a.split()[0].lower() == b.split()[0].lower() else "contradiction"


# --------------------------------------------------------------------------------------------------
# exact clusterer on hand-made cases


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["Paris", "Lyon", "paris."], [0, 1, 0]),
        (["The Beatles", "beatles", "Beatles!", "the  Rolling Stones"], [0, 0, 0, 1]),
        (["Lyon", "Paris", "Lyon", "Marseille", "PARIS"], [0, 1, 0, 2, 1]),
        (["an apple", "Apple", "apples"], [0, 0, 1]),  # articles dropped; plural is a new string
        (["Paris"], [0]),
        ([], []),
        (["", "  ", "the", "x"], [0, 0, 0, 1]),  # empty after normalisation: one (empty) answer
        (["42", "42.0", "forty-two"], [0, 1, 2]),  # lexical floor: no numeric or semantic matching
    ],
)
def test_exact_clusterer_hand_made(answers, expected):
    assert ExactClusterer().cluster(Q, answers) == expected


def test_exact_cluster_many_matches_cluster_and_validates():
    c = ExactClusterer()
    qs = [Q, "Who wrote Hamlet?", "Empty?"]
    answers = [["Paris", "Lyon", "paris"], ["Shakespeare", "Marlowe", "Marlowe"], []]
    assert c.cluster_many(qs, answers) == [
        c.cluster(q, a) for q, a in zip(qs, answers, strict=True)
    ]
    assert c.cluster_many([], []) == []
    with pytest.raises(ValueError, match="questions"):
        c.cluster_many([Q], [])
    with pytest.raises(TypeError):
        c.cluster_many(Q, [["Paris"]])
    with pytest.raises(TypeError):
        c.cluster(Q, "Paris")
    with pytest.raises(TypeError):
        c.cluster(Q, ["Paris", 3])


def test_info_records_the_clusterer():
    info = ExactClusterer().info()
    assert info["clusterer"] == "exact"
    assert {"model", "threshold", "relation", "partition"} <= set(info)
    assert info["partition"] == "representative"


# --------------------------------------------------------------------------------------------------
# dedupe / canonical variant


def test_dedupe_groups_by_normalised_text_in_first_appearance_order():
    d = dedupe_answers(["Lyon", " Paris ", "paris", "LYON!", "Paris"])
    assert d.keys == ["lyon", "paris"]
    assert d.index == [0, 1, 1, 0, 1]
    assert d.texts == ["LYON!", "Paris"]  # tie Lyon/LYON! -> smallest string; Paris twice wins


def test_canonical_variant_is_order_independent():
    variants = ["paris", "Paris.", "PARIS", "Paris."]
    for _ in range(10):
        random.shuffle(variants)
        assert canonical_variant(variants) == "Paris."
    with pytest.raises(ValueError):
        canonical_variant([])


def test_first_appearance_ids():
    assert first_appearance_ids([7, 7, 3, 9, 3]) == [0, 0, 1, 2, 1]
    assert first_appearance_ids([]) == []


# --------------------------------------------------------------------------------------------------
# the partition algorithm


def test_leader_partition_does_not_chain_a_non_transitive_relation():
    # 0 ~ 1 and 1 ~ 2 but not 0 ~ 2: 2 must not join 0's cluster through 1.
    rel = {(0, 1), (1, 2)}

    def eq(i, j):
        return (i, j) in rel or (j, i) in rel

    assert leader_partition(3, eq) == [0, 0, 1]
    # Reordered so the ambiguous item comes first: it represents both neighbours.
    rel = {(0, 1), (0, 2)}
    assert leader_partition(3, eq) == [0, 0, 0]


def test_leader_partition_joins_the_earliest_cluster():
    # item 2 is equivalent to both representatives 0 and 1: it joins cluster 0.
    assert leader_partition(3, lambda i, r: i == 2 or i == r) == [0, 1, 0]


def test_leader_partition_many_batches_one_call_per_step():
    calls = []

    def judge(queries):
        calls.append(list(queries))
        return [False] * len(queries)

    ids = leader_partition_many([3, 1, 4, 0], judge)
    assert ids == [[0, 1, 2], [0], [0, 1, 2, 3], []]
    assert len(calls) == 3  # steps t = 1, 2, 3 cover all questions
    assert calls[0] == [(0, 1, 0), (2, 1, 0)]
    assert calls[2] == [(2, 3, 0), (2, 3, 1), (2, 3, 2)]
    # Never the full N x N matrix: item t is compared only with the current representatives.
    assert sum(len(c) for c in calls) == (1 + 2) + (1 + 2 + 3)


def test_leader_partition_all_equivalent_needs_u_minus_1_comparisons():
    calls = []

    def judge(queries):
        calls.append(len(queries))
        return [True] * len(queries)

    assert leader_partition_many([10], judge) == [[0] * 10]
    assert sum(calls) == 9


def test_leader_partition_rejects_bad_input():
    with pytest.raises(ValueError):
        leader_partition_many([-1], lambda q: [])
    with pytest.raises(RuntimeError):
        leader_partition_many([3], lambda q: [])
    assert leader_partition_many([], lambda q: []) == []


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda n: st.tuples(
            st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)))
        )
    )
)
def test_leader_partition_properties_for_any_relation(case):
    n, pairs = case
    rel = {(i, j) for i, j in pairs} | {(j, i) for i, j in pairs}

    def eq(i, j):
        return i == j or (i, j) in rel

    ids = leader_partition(n, eq)
    assert len(ids) == n
    assert is_first_appearance(ids)
    assert ids == leader_partition(n, eq)  # deterministic
    reps = {}
    for item, c in enumerate(ids):
        reps.setdefault(c, item)
    for item, c in enumerate(ids):
        # every member is equivalent to its cluster's representative ...
        assert eq(item, reps[c])
        # ... and founders are equivalent to no earlier representative; joiners pick the earliest.
        earlier = [r for cc, r in reps.items() if r < item]
        matching = [reps_c for reps_c in sorted(earlier) if eq(item, reps_c)]
        if reps[c] == item:
            assert not matching
        else:
            assert reps[c] == matching[0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=10), st.randoms(use_true_random=False))
def test_equivalence_relation_gives_its_classes_in_any_order(labels, rnd):
    """For an equivalence relation the partition is its classes, whatever the order."""
    n = len(labels)
    ids = leader_partition(n, lambda i, j: labels[i] == labels[j])
    assert ids == first_appearance_ids(labels)
    perm = list(range(n))
    rnd.shuffle(perm)
    ids_p = leader_partition(n, lambda i, j: labels[perm[i]] == labels[perm[j]])
    assert as_partition(ids_p, perm) == as_partition(ids, list(range(n)))


# --------------------------------------------------------------------------------------------------
# the clusterer-level partition properties


VARIANTS = {
    "paris": ["Paris", "paris", "PARIS.", " Paris "],
    "lyon": ["Lyon", "lyon!"],
    "capital": ["The capital is Paris", "the capital is paris"],
    "nice": ["Nice", "nice?"],
}
ANSWER = st.sampled_from([v for vs in VARIANTS.values() for v in vs])


def spelling_sensitive(q, a, b):
    """A relation that depends on the raw spelling (e.g. capitals): a model can behave like this."""
    first = {x.strip()[0] for x in (a, b)}
    if len(first) == 1 and a.strip()[0].isupper():
        return "entailment"
    return "entailment" if normalize_answer(a)[:1] == normalize_answer(b)[:1] else "neutral"


@settings(max_examples=150, deadline=None)
@given(st.lists(ANSWER, min_size=1, max_size=10), st.randoms(use_true_random=False))
def test_clusterer_ids_are_contiguous_deterministic_and_invariant_to_swapping_identical_answers(
    answers, rnd
):
    for make in (ExactClusterer, lambda: RuleClusterer(spelling_sensitive)):
        ids = make().cluster(Q, answers)
        assert len(ids) == len(answers)
        assert is_first_appearance(ids)
        assert ids == make().cluster(Q, answers)  # deterministic (fresh instance, no cache)
        # identical (same normalised text) answers share a cluster
        keys = [normalize_answer(a) for a in answers]
        for i in range(len(answers)):
            for j in range(len(answers)):
                if keys[i] == keys[j]:
                    assert ids[i] == ids[j]
        # permute answers only among positions holding the same normalised text
        swapped = list(answers)
        for key in set(keys):
            pos = [i for i, k in enumerate(keys) if k == key]
            vals = [answers[i] for i in pos]
            rnd.shuffle(vals)
            for i, v in zip(pos, vals, strict=True):
                swapped[i] = v
        assert make().cluster(Q, swapped) == ids


@settings(max_examples=100, deadline=None)
@given(st.lists(ANSWER, min_size=1, max_size=10), st.randoms(use_true_random=False))
def test_exact_clusterer_partition_is_permutation_invariant(answers, rnd):
    perm = list(range(len(answers)))
    rnd.shuffle(perm)
    c = ExactClusterer()
    ids = c.cluster(Q, answers)
    ids_p = c.cluster(Q, [answers[p] for p in perm])
    assert as_partition(ids_p, perm) == as_partition(ids, list(range(len(answers))))
    assert max(ids) + 1 == len({normalize_answer(a) for a in answers})


# --------------------------------------------------------------------------------------------------
# pairwise machinery: relations, both directions, dedupe before the model, caching, batching


@pytest.mark.parametrize(
    ("fwd", "bwd", "strict", "loose"),
    [
        ("entailment", "entailment", True, True),
        ("entailment", "neutral", False, True),
        ("neutral", "entailment", False, True),
        ("neutral", "neutral", False, False),
        ("entailment", "contradiction", False, False),
        ("contradiction", "entailment", False, False),
        ("neutral", "contradiction", False, False),
        ("contradiction", "contradiction", False, False),
    ],
)
def test_relations(fwd, bwd, strict, loose):
    assert equivalent(fwd, bwd, "strict") is strict
    assert equivalent(fwd, bwd, "loose") is loose


def test_unknown_relation_is_rejected():
    with pytest.raises(ValueError, match="relation"):
        equivalent("entailment", "entailment", "medium")
    with pytest.raises(ValueError, match="relation"):
        RuleClusterer(same_first_word, relation="medium")


def test_pairwise_asks_both_directions_with_the_question():
    c = RuleClusterer(same_first_word)
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 1]
    assert c.calls == [[(Q, "Lyon", "Paris"), (Q, "Paris", "Lyon")]]


def test_one_way_entailment_is_equivalent_only_under_loose():
    def rule(q, a, b):  # "Paris, France" entails "Paris" but not the other way round
        if a == b:
            return "entailment"
        return "entailment" if a.startswith(b) else "neutral"

    answers = ["Paris", "Paris, France"]
    assert RuleClusterer(rule, "strict").cluster(Q, answers) == [0, 1]
    assert RuleClusterer(rule, "loose").cluster(Q, answers) == [0, 0]


def test_pairwise_dedupes_before_the_model_and_caches_verdicts():
    c = RuleClusterer(same_first_word)
    answers = ["Paris", "paris", "PARIS!", "Paris", "Lyon", "lyon"]
    assert c.cluster(Q, answers) == [0, 0, 0, 0, 1, 1]
    asked = [t for call in c.calls for t in call]
    assert len(asked) == 2  # only Paris vs Lyon, both directions
    assert c.stats.unique_answers == 2 and c.stats.answers == 6
    # the same question again: everything from the cache, no model call
    assert c.cluster(Q, ["Lyon", "Paris"]) == [0, 1]
    assert len(c.calls) == 1
    assert c.stats.cache_hits == 2
    c.clear_cache()
    c.cluster(Q, ["Lyon", "Paris"])
    assert len(c.calls) == 2


def test_cluster_many_batches_across_questions():
    c = RuleClusterer(same_first_word)
    qs = ["q1", "q2", "q3"]
    answers = [
        ["a x", "b x", "c x", "a y"],
        ["z", "z z", "y"],
        ["only"],
    ]
    ids = c.cluster_many(qs, answers)
    assert ids == [[0, 1, 2, 0], [0, 0, 1], [0]]
    # one model call per partition step (max distinct answers - 1), not per question or pair
    assert len(c.calls) == 3
    assert {t[0] for t in c.calls[0]} == {"q1", "q2"}
    # results equal one-at-a-time clustering
    fresh = RuleClusterer(same_first_word)
    assert ids == [fresh.cluster(q, a) for q, a in zip(qs, answers, strict=True)]


def test_pairwise_questions_are_part_of_the_cache_key():
    def rule(q, a, b):
        return "entailment" if q == "same?" else "contradiction"

    c = RuleClusterer(rule)
    assert c.cluster_many(["same?", "differ?"], [["x", "y"], ["x", "y"]]) == [[0, 0], [0, 1]]


# --------------------------------------------------------------------------------------------------
# registry


def test_registry_names_and_options():
    for name, cls in CLUSTERERS.items():
        assert cls.name == name  # results record cls.name: it must load the same clusterer back
    assert isinstance(load_clusterer("exact"), ExactClusterer)
    assert isinstance(load_clusterer(" EXACT "), ExactClusterer)
    # None-valued generic options (as a CLI passes them) are ignored
    assert isinstance(
        load_clusterer("exact", model=None, threshold=None, relation=None), ExactClusterer
    )
    with pytest.raises(ValueError, match="does not take"):
        load_clusterer("exact", threshold=0.5)
    with pytest.raises(ValueError, match="does not take"):
        load_clusterer("embedding", relation="loose")
    with pytest.raises(ValueError, match="relation"):
        load_clusterer("nli", relation="medium")
    with pytest.raises(ValueError, match="unknown clusterer"):
        load_clusterer("kmeans")
    with pytest.raises(ValueError, match="explicitly"):
        load_clusterer("auto", model="some/model")


def test_auto_falls_back_to_embedding_without_a_local_nli_model(monkeypatch, tmp_path):
    import gnll.semantic as sem

    monkeypatch.setattr(sem, "local_nli_model_available", lambda name=None: False)
    assert sem.default_clusterer_name() == "embedding"
    monkeypatch.setattr(sem, "local_nli_model_available", lambda name=None: True)
    assert sem.default_clusterer_name() == "nli"


def test_local_nli_model_available_for_directories(tmp_path):
    from gnll.semantic import local_nli_model_available

    assert not local_nli_model_available(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert local_nli_model_available(str(tmp_path))
    assert not local_nli_model_available("no-such-org/no-such-model-xyz")


# --------------------------------------------------------------------------------------------------
# SE / LN-SE / D-SE / MCP end to end with a clusterer


def test_semantic_measures_end_to_end_with_exact_clusterer():
    answers = ["Paris", "paris.", "Lyon", "The capital is Paris", "Paris"]
    logprobs = [[-0.1, -0.2], [-0.5], [-1.0, -1.0, -0.5], [-0.3, -0.3, -0.3, -0.3], [-0.1, -0.2]]
    ids = ExactClusterer().cluster(Q, answers)
    assert ids == [0, 0, 1, 2, 0]

    # by hand: p(y^n) ∝ exp(sum log p), cluster masses normalised over the 5 samples
    seq = np.exp([-0.3, -0.5, -2.5, -1.2, -0.3])
    z = seq.sum()
    p = np.array([seq[0] + seq[1] + seq[4], seq[2], seq[3]]) / z
    se = -(p * np.log(p)).sum()
    assert measures.semantic_entropy_plugin(logprobs, ids) == pytest.approx(se, rel=1e-12)
    se_mc = -(3 * np.log(p[0]) + np.log(p[1]) + np.log(p[2])) / 5  # the paper's Eq. (5)
    assert measures.semantic_entropy(logprobs, ids) == pytest.approx(se_mc, rel=1e-12)
    assert measures.max_cluster_probability(logprobs, ids) == pytest.approx(-math.log(p.max()))
    freq = np.array([3, 1, 1]) / 5
    assert measures.discrete_semantic_entropy(ids) == pytest.approx(-(freq * np.log(freq)).sum())

    ln = np.exp([-0.15, -0.5, -2.5 / 3, -0.3, -0.15])
    pl = np.array([ln[0] + ln[1] + ln[4], ln[2], ln[3]]) / ln.sum()
    assert measures.ln_semantic_entropy_plugin(logprobs, ids) == pytest.approx(
        -(pl * np.log(pl)).sum()
    )
    assert measures.ln_semantic_entropy(logprobs, ids) == pytest.approx(
        -(3 * np.log(pl[0]) + np.log(pl[1]) + np.log(pl[2])) / 5
    )


def test_semantic_measures_end_to_end_with_a_pairwise_clusterer():
    """A meaning-level relation merges lexically different answers, lowering SE and D-SE."""

    def meaning(q, a, b):
        def m(x):
            return "paris" if "paris" in x.lower() else normalize_answer(x)

        return "entailment" if m(a) == m(b) else "contradiction"

    answers = ["Paris", "The capital is Paris", "Lyon", "It's Paris."]
    logprobs = [[-0.2], [-1.0, -0.5], [-0.7], [-0.9, -0.1]]
    exact_ids = ExactClusterer().cluster(Q, answers)
    sem_ids = RuleClusterer(meaning).cluster(Q, answers)
    assert exact_ids == [0, 1, 2, 3]
    assert sem_ids == [0, 0, 1, 0]
    assert measures.discrete_semantic_entropy(sem_ids) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    )
    assert measures.discrete_semantic_entropy(exact_ids) == pytest.approx(math.log(4))
    assert measures.semantic_entropy(logprobs, sem_ids) < measures.semantic_entropy(
        logprobs, exact_ids
    )
    seq = np.exp([-0.2, -1.5, -0.7, -1.0])
    p_paris = (seq[0] + seq[1] + seq[3]) / seq.sum()
    assert measures.max_cluster_probability(logprobs, sem_ids) == pytest.approx(-math.log(p_paris))
