"""The lexical floor: answers are equivalent iff their SQuAD-normalised texts are equal."""

from __future__ import annotations

from typing import Any

from gnll.semantic.base import Clusterer

__all__ = ["ExactClusterer"]


class ExactClusterer(Clusterer):
    """SQuAD-normalised string equality (:func:`gnll.text.normalize_answer`); no model.

    >>> ExactClusterer().cluster("Who wrote Hamlet?", ["Shakespeare", "Marlowe", "shakespeare!"])
    [0, 1, 0]
    """

    name = "exact"

    def _cluster_unique(self, questions: list[str], texts: list[list[str]]) -> list[list[int]]:
        # De-duplication by normalised text has already happened: every distinct item is a cluster.
        return [list(range(len(t))) for t in texts]

    def info(self) -> dict[str, Any]:
        return {**super().info(), "relation": "normalized-exact-match"}
