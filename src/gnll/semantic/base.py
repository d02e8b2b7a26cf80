"""The clusterer interface and the machinery shared by the pairwise (NLI, LLM) clusterers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gnll.semantic.partition import dedupe_answers, first_appearance_ids, leader_partition_many

__all__ = [
    "ENTAILMENT",
    "NEUTRAL",
    "CONTRADICTION",
    "RELATIONS",
    "Clusterer",
    "ClusteringStats",
    "PairwiseClusterer",
    "Relation",
    "equivalent",
]

Relation = Literal["strict", "loose"]
#: ``strict``: each answer entails the other (bidirectional entailment, the paper's rule).
#: ``loose``: neither direction is a contradiction, and not both directions are neutral.
RELATIONS: tuple[str, ...] = ("strict", "loose")

ENTAILMENT, NEUTRAL, CONTRADICTION = "entailment", "neutral", "contradiction"


def equivalent(forward: str, backward: str, relation: str) -> bool:
    """Whether two answers are equivalent, given the NLI labels of ``a => b`` and ``b => a``.

    >>> E, N = "entailment", "neutral"
    >>> equivalent(E, E, "strict"), equivalent(E, N, "strict")
    (True, False)
    >>> equivalent("entailment", "neutral", "loose"), equivalent("neutral", "neutral", "loose")
    (True, False)
    """
    if relation == "strict":
        return forward == ENTAILMENT and backward == ENTAILMENT
    if relation == "loose":
        return CONTRADICTION not in (forward, backward) and not (forward == backward == NEUTRAL)
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


def as_bool(value: object) -> bool:
    """A flag from a bool or from CLI text (``true/false``, ``yes/no``, ``1/0``, ``on/off``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "1", "on"):
            return True
        if text in ("false", "no", "0", "off"):
            return False
        raise ValueError(f"expected a boolean, got {value!r}")
    return bool(value)


def check_relation(relation: str) -> str:
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    return relation


@dataclass
class ClusteringStats:
    """Work counters of one clusterer instance (cumulative over its calls)."""

    questions: int = 0
    answers: int = 0
    unique_answers: int = 0
    #: Pair comparisons asked by the partition algorithm (after de-duplication).
    comparisons: int = 0
    #: Model inputs actually computed (directional pairs for NLI/LLM, texts for embeddings).
    model_inputs: int = 0
    #: Model inputs answered from the cache instead.
    cache_hits: int = 0
    #: Calls into the model (forward passes for NLI/embedding, generate calls for LLM).
    model_calls: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


class Clusterer(ABC):
    """Groups the answers to a question into meaning classes.

    Subclasses implement :meth:`_cluster_unique` on de-duplicated answers; this class handles
    de-duplication (:func:`gnll.semantic.partition.dedupe_answers`) and id bookkeeping, so every
    clusterer returns ids ``0..k-1`` in order of first appearance and puts answers with the same
    normalised text together without a model call.
    """

    #: Registry name (``exact``, ``embedding``, ``nli``, ``llm``).
    name: str = "base"

    def __init__(self) -> None:
        self.stats = ClusteringStats()

    def cluster(self, question: str, answers: Sequence[str]) -> list[int]:
        """Cluster ids of ``answers`` (one per answer, ``0..k-1`` in order of first appearance).

        >>> from gnll.semantic import ExactClusterer
        >>> ExactClusterer().cluster("Capital of France?", ["Paris", "Lyon", "paris."])
        [0, 1, 0]
        """
        return self.cluster_many([question], [answers])[0]

    def cluster_many(
        self, questions: Sequence[str], list_of_answers: Sequence[Sequence[str]]
    ) -> list[list[int]]:
        """Cluster several questions' answers; model calls are batched across the questions."""
        if isinstance(questions, str):
            raise TypeError(
                "questions must be a sequence of strings; use cluster() for one question"
            )
        if len(questions) != len(list_of_answers):
            raise ValueError(
                f"got {len(questions)} questions but {len(list_of_answers)} lists of answers"
            )
        for i, q in enumerate(questions):
            if not isinstance(q, str):
                raise TypeError(f"questions[{i}] must be a str, got {type(q).__name__}")
        deduped = [dedupe_answers(answers) for answers in list_of_answers]
        self.stats.questions += len(questions)
        self.stats.answers += sum(len(d.index) for d in deduped)
        self.stats.unique_answers += sum(len(d.texts) for d in deduped)
        unique_ids = self._cluster_unique(list(questions), [d.texts for d in deduped])
        out = []
        for d, uids in zip(deduped, unique_ids, strict=True):
            if len(uids) != len(d.texts):
                raise RuntimeError(
                    f"{type(self).__name__} returned {len(uids)} ids for {len(d.texts)}"
                )
            out.append(first_appearance_ids([uids[j] for j in d.index]))
        return out

    @abstractmethod
    def _cluster_unique(self, questions: list[str], texts: list[list[str]]) -> list[list[int]]:
        """Cluster ids for each question's distinct answers (given as canonical raw texts)."""

    def info(self) -> dict[str, Any]:
        """What produced the clusters, for results files (clusterer, model, threshold, relation)."""
        return {
            "clusterer": self.name,
            "model": None,
            "threshold": None,
            "relation": None,
            "partition": "representative",
            "dedupe": "squad-normalized",
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.info().items() if k != "clusterer")
        return f"{type(self).__name__}({args})"


class PairwiseClusterer(Clusterer):
    """A clusterer whose relation comes from directional entailment labels ``a => b``.

    Subclasses implement :meth:`_predict_directional` for a batch of ``(question, premise,
    hypothesis)`` triples. Verdicts are cached per directional triple for the lifetime of the
    instance, so an answer pair met again (in another call, or as ``b => a`` of a pair asked the
    other way) costs nothing.
    """

    def __init__(self, relation: str = "strict") -> None:
        super().__init__()
        self.relation = check_relation(relation)
        self._cache: dict[tuple[str, str, str], str] = {}

    @abstractmethod
    def _predict_directional(self, triples: list[tuple[str, str, str]]) -> list[str]:
        """``entailment``/``neutral``/``contradiction`` per (question, premise, hypothesis)."""

    def clear_cache(self) -> None:
        self._cache.clear()

    def _labels(self, triples: list[tuple[str, str, str]]) -> list[str]:
        todo = list(dict.fromkeys(t for t in triples if t not in self._cache))
        self.stats.cache_hits += len(triples) - len(todo)
        if todo:
            labels = self._predict_directional(todo)
            if len(labels) != len(todo):
                raise RuntimeError(f"got {len(labels)} labels for {len(todo)} pairs")
            self.stats.model_inputs += len(todo)
            self._cache.update(zip(todo, labels, strict=True))
        return [self._cache[t] for t in triples]

    def _cluster_unique(self, questions: list[str], texts: list[list[str]]) -> list[list[int]]:
        def judge(queries: list[tuple[int, int, int]]) -> list[bool]:
            self.stats.comparisons += len(queries)
            triples = []
            for q, i, r in queries:
                a, b = texts[q][i], texts[q][r]
                triples += [(questions[q], a, b), (questions[q], b, a)]
            labels = self._labels(triples)
            return [
                equivalent(labels[2 * j], labels[2 * j + 1], self.relation)
                for j in range(len(queries))
            ]

        return leader_partition_many([len(t) for t in texts], judge)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "relation": self.relation}
