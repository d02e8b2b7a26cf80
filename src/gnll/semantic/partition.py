"""The partition algorithm shared by every clusterer.

Semantic entropy needs a *partition* of the N sampled answers into meaning classes. A pairwise
relation ("a and b mean the same") computed by a model is in general not transitive: ``a ~ b`` and
``b ~ c`` do not imply ``a ~ c``. The reference implementation of Farquhar et al. (2024)
nevertheless assigns ids in a greedy pass that lets a later answer *re-label* an earlier one, so its
output depends on the visiting order in ways that are hard to state. We use a rule that is a
partition by construction:

**Representative (leader) clustering.**

1. *De-duplicate.* Answers with the same SQuAD-normalised text (:func:`gnll.text.normalize_answer`)
   are one item; they are never sent to a model and always share a cluster. Items are ordered by the
   first appearance of their normalised form. Each item is shown to the model through one
   *canonical* raw variant: the most frequent stripped spelling in the group, ties broken by the
   smallest string, so the result does not depend on where the duplicates stand in the list.
2. *Lead.* Item 0 founds cluster 0 and is its representative. Each later item ``t`` is compared with
   the representative (founding item) of every existing cluster; it joins the *earliest-founded*
   cluster whose representative is equivalent to it, and otherwise founds a new cluster with itself
   as the representative.
3. *Ids.* Clusters are numbered in order of foundation, so ids are ``0..k-1`` in order of first
   appearance; every answer gets the id of its item.

Properties (tested in ``tests/test_semantic*.py``):

- always a partition; ids contiguous from 0 in first-appearance order; deterministic;
- invariant to any reordering that only swaps identical (same normalised text) answers;
- if the relation happens to be an equivalence relation (exact match, or a model that is consistent
  on these answers), the result is exactly its equivalence classes, whatever the order of the
  answers;
- for a non-transitive relation it differs from connected components (transitive closure) in that it
  never *chains*: every member of a cluster is equivalent to its representative, so a vague answer
  ``b`` with ``a ~ b`` and ``b ~ c`` cannot pull ``a`` and ``c`` together unless ``a ~ c``.

**Cost.** Item ``t`` needs one comparison per existing cluster, so a question with ``u`` distinct
answers in ``k`` clusters needs at most ``sum_t min(t, k) <= u (u - 1) / 2`` comparisons -- ``u-1``
when all answers agree -- instead of the full ``u x u`` matrix. The comparisons of step ``t`` are
independent of each other, and of those of other questions, so :func:`leader_partition_many` asks
for all of them in one call per step: at most ``max_u-1`` model calls for a whole batch of
questions, each a batch of pairs. (Comparing ``t`` with *all* representatives, instead of stopping
at the first match, costs a few extra pairs but keeps one call per step.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from gnll.text import normalize_answer

__all__ = [
    "DedupedAnswers",
    "Judge",
    "canonical_variant",
    "dedupe_answers",
    "first_appearance_ids",
    "leader_partition",
    "leader_partition_many",
]

#: A batched pairwise judge: receives ``(question_index, item, representative)`` triples and returns
#: one bool per triple (is ``item`` equivalent to ``representative``?).
Judge = Callable[[list[tuple[int, int, int]]], Sequence[bool]]


@dataclass(frozen=True)
class DedupedAnswers:
    """The distinct answers of one question.

    Attributes
    ----------
    keys:
        Distinct normalised answers, in order of first appearance.
    texts:
        One canonical raw variant per key (see :func:`canonical_variant`): what a model is shown.
    index:
        For each original answer, the position of its key in ``keys``.
    """

    keys: list[str]
    texts: list[str]
    index: list[int]


def canonical_variant(variants: Sequence[str]) -> str:
    """The representative spelling of a group of answers with one normalised form.

    The most frequent white-space-stripped variant; ties are broken by the smallest string, so the
    choice does not depend on the order of ``variants``.

    >>> canonical_variant(["Paris.", "paris", "Paris.", "paris"])
    'Paris.'
    """
    if not variants:
        raise ValueError("canonical_variant needs at least one variant")
    counts = Counter(v.strip() for v in variants)
    return min(counts, key=lambda v: (-counts[v], v))


def dedupe_answers(answers: Sequence[str]) -> DedupedAnswers:
    """Group ``answers`` by normalised text (see the module docstring, step 1).

    >>> d = dedupe_answers(["Paris", "Lyon", "paris!"])
    >>> d.keys, d.texts, d.index
    (['paris', 'lyon'], ['Paris', 'Lyon'], [0, 1, 0])
    """
    if isinstance(answers, str):
        raise TypeError("answers must be a sequence of strings, not a single string")
    keys: list[str] = []
    position: dict[str, int] = {}
    variants: list[list[str]] = []
    index: list[int] = []
    for i, answer in enumerate(answers):
        if not isinstance(answer, str):
            raise TypeError(f"answers[{i}] must be a str, got {type(answer).__name__}")
        key = normalize_answer(answer)
        if key not in position:
            position[key] = len(keys)
            keys.append(key)
            variants.append([])
        variants[position[key]].append(answer)
        index.append(position[key])
    return DedupedAnswers(keys=keys, texts=[canonical_variant(v) for v in variants], index=index)


def first_appearance_ids(labels: Sequence[Hashable]) -> list[int]:
    """Relabel arbitrary labels as ``0..k-1`` in order of first appearance.

    >>> first_appearance_ids(["b", "a", "b", "c"])
    [0, 1, 0, 2]
    """
    seen: dict[Hashable, int] = {}
    return [seen.setdefault(label, len(seen)) for label in labels]


def leader_partition_many(sizes: Sequence[int], judge: Judge) -> list[list[int]]:
    """Representative clustering of several questions' items at once.

    Parameters
    ----------
    sizes:
        Number of distinct items of each question.
    judge:
        Batched equivalence test, called once per step with every ``(question, item,
        representative)`` triple that step needs (never with an empty list).

    Returns
    -------
    list[list[int]]
        Cluster ids of each question's items, ``0..k-1`` in order of foundation.
    """
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be non-negative, got {sizes}")
    ids: list[list[int]] = [[0] + [-1] * (s - 1) if s else [] for s in sizes]
    reps: list[list[int]] = [[0] if s else [] for s in sizes]  # representative item of each cluster
    for t in range(1, max(sizes, default=0)):
        queries = [(q, t, r) for q, s in enumerate(sizes) if t < s for r in reps[q]]
        verdicts = list(judge(queries))
        if len(verdicts) != len(queries):
            raise RuntimeError(f"judge returned {len(verdicts)} verdicts for {len(queries)} pairs")
        joined: dict[int, int] = {}
        for (q, _, r), same in zip(queries, verdicts, strict=True):
            if same and q not in joined:  # queries are in cluster order: the first match wins
                joined[q] = ids[q][r]
        for q, s in enumerate(sizes):
            if t >= s:
                continue
            if q in joined:
                ids[q][t] = joined[q]
            else:
                ids[q][t] = len(reps[q])
                reps[q].append(t)
    return ids


def leader_partition(n: int, equivalent: Callable[[int, int], bool]) -> list[int]:
    """Representative clustering of ``n`` items with an unbatched relation ``equivalent(item,
    rep)``.

    >>> leader_partition(4, lambda i, j: (i % 2) == (j % 2))
    [0, 1, 0, 1]
    """
    return leader_partition_many([n], lambda qs: [bool(equivalent(i, r)) for _, i, r in qs])[0]
