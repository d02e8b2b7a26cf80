"""Semantic clustering of sampled answers, for SE, LN-SE, D-SE and MCP.

One interface, :class:`Clusterer`: ``cluster(question, answers) -> ids`` (``0..k-1`` in order of
first appearance) and ``cluster_many(questions, list_of_answers)`` (model calls batched across
questions). Implementations, by registry name:

- ``exact``: SQuAD-normalised string equality (:class:`ExactClusterer`), no model;
- ``embedding``: cosine similarity of all-MiniLM-L6-v2 embeddings of the answers (optionally
  prefixed by the question) above a threshold (:class:`EmbeddingClusterer`), offline from a PyPI
  package;
- ``nli``: bidirectional entailment under an NLI classifier (:class:`NLIClusterer`), default
  ``microsoft/deberta-large-mnli``. The paper names no NLI model; Farquhar et al.'s code, whose setup
  it follows, uses ``microsoft/deberta-v2-xlarge-mnli`` (:data:`REFERENCE_NLI_MODEL`, what the paper
  presets load);
- ``llm``: bidirectional entailment asked of a language model (:class:`LLMEntailmentClusterer`);
- ``auto``: ``nli`` if the default NLI model is available locally, otherwise ``embedding`` (the
  run's ``table.md`` names the clusterer that was used).

All of them share the partition rule of :mod:`gnll.semantic.partition`. ``info()`` records what
produced the clusters (clusterer, model, threshold, relation) for results files.

>>> from gnll.semantic import load_clusterer
>>> from gnll import measures
>>> clusterer = load_clusterer("exact")
>>> ids = clusterer.cluster("Capital of France?", ["Paris", "paris", "Lyon"])
>>> ids
[0, 0, 1]
>>> round(measures.discrete_semantic_entropy(ids), 4)
0.6365
"""

from __future__ import annotations

from typing import Any

from gnll.semantic.base import (
    RELATIONS,
    Clusterer,
    ClusteringStats,
    PairwiseClusterer,
    Relation,
    equivalent,
)
from gnll.semantic.embedding import (
    DEFAULT_EMBEDDING_THRESHOLD,
    DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION,
    EmbeddingClusterer,
    SentenceEmbedder,
    find_embedded_minilm,
)
from gnll.semantic.exact import ExactClusterer
from gnll.semantic.llm import LLMEntailmentClusterer, entailment_prompt, parse_entailment
from gnll.semantic.nli import (
    DEFAULT_NLI_MODEL,
    REFERENCE_NLI_MODEL,
    NLIClusterer,
    local_nli_model_available,
    nli_label_map,
)
from gnll.semantic.partition import (
    canonical_variant,
    dedupe_answers,
    first_appearance_ids,
    leader_partition,
    leader_partition_many,
)

__all__ = [
    "AUTO_NAMES",
    "CLUSTERERS",
    "DEFAULT_CLUSTERER",
    "DEFAULT_EMBEDDING_THRESHOLD",
    "DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION",
    "DEFAULT_NLI_MODEL",
    "REFERENCE_NLI_MODEL",
    "RELATIONS",
    "Clusterer",
    "ClusteringStats",
    "EmbeddingClusterer",
    "ExactClusterer",
    "LLMEntailmentClusterer",
    "NLIClusterer",
    "PairwiseClusterer",
    "Relation",
    "SentenceEmbedder",
    "canonical_variant",
    "dedupe_answers",
    "default_clusterer_name",
    "resolve_clusterer_name",
    "takes_option",
    "entailment_prompt",
    "equivalent",
    "find_embedded_minilm",
    "first_appearance_ids",
    "leader_partition",
    "leader_partition_many",
    "load_clusterer",
    "local_nli_model_available",
    "nli_label_map",
    "parse_entailment",
    "register_clusterer",
]

#: Registry: name -> class.
CLUSTERERS: dict[str, type[Clusterer]] = {
    "exact": ExactClusterer,
    "embedding": EmbeddingClusterer,
    "nli": NLIClusterer,
    "llm": LLMEntailmentClusterer,
}
DEFAULT_CLUSTERER = "auto"

# Which generic options each clusterer understands (the CLI passes model/threshold/relation).
_ACCEPTS: dict[str, set[str]] = {
    "exact": set(),
    "embedding": {"model", "threshold"},
    "nli": {"model", "relation"},
    "llm": {"model", "relation"},
}


def register_clusterer(cls: type[Clusterer], *, accepts: tuple[str, ...] = ()) -> type[Clusterer]:
    """Make ``cls`` selectable by its ``name`` (``--clusterer NAME``, :func:`load_clusterer`).

    ``accepts`` lists the generic options (``model``, ``threshold``, ``relation``) it takes; other
    constructor arguments come through ``--clusterer_args``. Usable as a decorator.

    >>> class Length(Clusterer):
    ...     name = "length-demo"
    ...     def _cluster_unique(self, questions, texts):
    ...         return [[len(t) for t in ts] for ts in texts]
    >>> _ = register_clusterer(Length)
    >>> load_clusterer("length-demo").cluster("Q?", ["ab", "cd", "abc"])
    [0, 0, 1]
    >>> _ = CLUSTERERS.pop("length-demo"), _ACCEPTS.pop("length-demo")
    """
    unknown = set(accepts) - {"model", "threshold", "relation"}
    if unknown:
        raise ValueError(f"accepts takes model, threshold and relation, not {sorted(unknown)}")
    if cls.name in CLUSTERERS or cls.name in AUTO_NAMES:
        raise ValueError(f"a clusterer named {cls.name!r} already exists")
    CLUSTERERS[cls.name] = cls
    _ACCEPTS[cls.name] = set(accepts)
    return cls


#: Names that ask for the default clusterer of this machine.
AUTO_NAMES = ("auto", "default")


def default_clusterer_name(nli_model: str = DEFAULT_NLI_MODEL) -> str:
    """``"nli"`` if ``nli_model`` is available without the network, else ``"embedding"``."""
    return "nli" if local_nli_model_available(nli_model) else "embedding"


def resolve_clusterer_name(name: str) -> str:
    """The registered clusterer ``name`` stands for: ``auto``/``default`` -> this machine's default.

    >>> resolve_clusterer_name(" Exact ")
    'exact'
    """
    key = name.strip().lower()
    return default_clusterer_name() if key in AUTO_NAMES else key


def takes_option(name: str, option: str) -> bool:
    """Whether the registered clusterer ``name`` understands ``model``/``threshold``/``relation``."""
    return option in _ACCEPTS.get(name, set())


def load_clusterer(
    name: str = DEFAULT_CLUSTERER,
    *,
    model: Any = None,
    threshold: float | None = None,
    relation: str | None = None,
    **kwargs: Any,
) -> Clusterer:
    """Build a clusterer by registry name.

    Parameters
    ----------
    name:
        ``exact``, ``embedding``, ``nli``, ``llm`` or ``auto`` (see the module docstring).
    model:
        Model name/path (or a loaded :class:`gnll.backends.Model` for ``llm``); ``None`` = the
        default.
    threshold:
        Cosine threshold (``embedding`` only); ``None`` = the calibrated default.
    relation:
        ``strict`` or ``loose`` (``nli`` and ``llm``); ``None`` = ``strict``.
    kwargs:
        Passed on to the clusterer's constructor (e.g. ``batch_size``, ``device``).

    Options set to ``None`` are ignored, so a CLI can pass all of them; an option that the chosen
    clusterer does not use raises ``ValueError`` rather than being silently dropped.
    """
    key = resolve_clusterer_name(name)
    if name.strip().lower() in AUTO_NAMES:
        if model is not None:
            raise ValueError(
                "name a clusterer explicitly ('nli', 'embedding', ...) when giving a model"
            )
        # 'auto' may resolve to a clusterer without a relation or a threshold: drop what does not
        # apply.
        relation = relation if takes_option(key, "relation") else None
        threshold = threshold if takes_option(key, "threshold") else None
    if key not in CLUSTERERS:
        raise ValueError(
            f"unknown clusterer {name!r}; choose one of {sorted(CLUSTERERS)} or 'auto'"
        )
    given = {"model": model, "threshold": threshold, "relation": relation}
    options = {k: v for k, v in given.items() if v is not None}
    unused = set(options) - _ACCEPTS[key]
    if unused:
        raise ValueError(f"the {key!r} clusterer does not take {sorted(unused)}")
    if "relation" in options and options["relation"] not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {options['relation']!r}")
    return CLUSTERERS[key](**options, **kwargs)
