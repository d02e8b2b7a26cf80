"""Monte-Carlo and search estimators of ``H(p)`` and ``M(p)`` on a prefix-tree distribution.

* :func:`sample_sequences` -- multinomial sampling (MS) at temperature ``tau``: every next-token
  distribution is tempered, ``q(v|u) ∝ p(v|u)**(1/tau)``, so ``q(y) = prod_t q(y_t|y_<t)``.
* :func:`predictive_entropy_estimates` -- ``H_N = -(1/N) sum_n w_n log p(y_n)`` with importance
  weights ``w = p/q`` clipped to ``[1/clip, clip]`` (``clip = 1e6`` as in App. C); ``w = 1`` at
  ``tau = 1``.
* :func:`max_estimates` -- ``M_N = -max_{n<=N} log p(y_n)``.
* :func:`beam_search` -- width-``W`` beam search on ``log p`` (``W = 1`` is greedy decoding).

All running estimators return the estimate for every ``N = 1..N_max`` from one nested sample set.

Example
-------
>>> import numpy as np
>>> from gnll.simulation.distributions import sample_tree, exact_values
>>> tree = sample_tree(20, 3, np.random.default_rng(0))
>>> s = sample_sequences(tree, 10, np.random.default_rng(1), temperature=0.5)
>>> predictive_entropy_estimates(s.log_p, s.log_q).shape
(10,)
>>> bool(beam_search_estimates(tree, 10)[-1] >= exact_values(tree).min_entropy - 1e-9)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnll.simulation.distributions import PrefixTreeDistribution, log_softmax

__all__ = [
    "BeamResult",
    "SampleBatch",
    "beam_search",
    "beam_search_estimates",
    "importance_weights",
    "max_estimates",
    "predictive_entropy_estimates",
    "sample_sequences",
    "tempered_log_probs",
]

DEFAULT_WEIGHT_CLIP = 1e6


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not np.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
    return t


def tempered_log_probs(log_probs: np.ndarray, temperature: float) -> np.ndarray:
    """Log-probs of the tempered distribution ``q ∝ p**(1/temperature)`` along the last axis.

    Example
    -------
    >>> np.exp(tempered_log_probs(np.log([0.8, 0.2]), 0.5)).round(4).tolist()
    [0.9412, 0.0588]
    """
    t = _check_temperature(temperature)
    lp = np.asarray(log_probs, dtype=np.float64)
    return lp if t == 1.0 else log_softmax(lp / t)


@dataclass(frozen=True)
class SampleBatch:
    """Sampled sequences and their log-probabilities.

    Attributes
    ----------
    tokens:
        ``(n, T)`` token ids.
    log_p:
        ``(n,)`` ``log p(y)`` under the target distribution.
    log_q:
        ``(n,)`` ``log q(y)`` under the (tempered) proposal that generated them.
    """

    tokens: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray


def sample_sequences(
    tree: PrefixTreeDistribution,
    n_samples: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
) -> SampleBatch:
    """Draw ``n_samples`` i.i.d. sequences by ancestral (multinomial) sampling at ``temperature``.

    Vectorised over samples: one gather of next-token rows per depth, inverse-CDF draws.

    Parameters
    ----------
    tree:
        Target distribution ``p``.
    n_samples:
        Number of sequences (>= 1).
    rng:
        Source of randomness.
    temperature:
        Per-step softmax temperature ``tau > 0`` of the proposal.

    Returns
    -------
    SampleBatch

    Example
    -------
    >>> from gnll.simulation.distributions import sample_tree
    >>> tree = sample_tree(20, 2, np.random.default_rng(0))
    >>> s = sample_sequences(tree, 5, np.random.default_rng(0))
    >>> s.tokens.shape, bool(np.allclose(s.log_p, s.log_q))
    ((5, 2), True)
    """
    t_ = _check_temperature(temperature)
    if int(n_samples) != n_samples or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    n = int(n_samples)
    v = tree.vocab_size
    rows_idx = np.arange(n)
    node = np.zeros(n, dtype=np.int64)
    tokens = np.empty((n, tree.length), dtype=np.int64)
    log_p = np.zeros(n)
    log_q = np.zeros(n)
    u = rng.random((n, tree.length))
    for t in range(tree.length):
        lp = tree.next_token_log_probs(t, node)
        lq = tempered_log_probs(lp, t_)
        cdf = np.cumsum(np.exp(lq), axis=1)
        tok = np.minimum(np.sum(cdf < u[:, t : t + 1] * cdf[:, -1:], axis=1), v - 1)
        # Never land on a zero-probability token through round-off at the CDF's flat tail.
        bad = ~np.isfinite(lq[rows_idx, tok])
        if np.any(bad):
            tok[bad] = np.argmax(lq[bad], axis=1)
        tokens[:, t] = tok
        log_p += lp[rows_idx, tok]
        log_q += lq[rows_idx, tok]
        node = node * v + tok
    return SampleBatch(tokens=tokens, log_p=log_p, log_q=log_q)


def importance_weights(
    log_p: np.ndarray, log_q: np.ndarray, clip: float = DEFAULT_WEIGHT_CLIP
) -> np.ndarray:
    """Importance weights ``p(y)/q(y)`` computed in log space and clipped to ``[1/clip, clip]``.

    Example
    -------
    >>> importance_weights(np.log([0.8, 0.2]), np.log([0.8 / 0.85, 0.2 / 3.4])).round(6).tolist()
    [0.85, 3.4]
    """
    if not clip >= 1:
        raise ValueError(f"clip must be >= 1, got {clip!r}")
    lw = np.asarray(log_p, dtype=np.float64) - np.asarray(log_q, dtype=np.float64)
    c = float(np.log(clip))
    return np.exp(np.clip(lw, -c, c))


def predictive_entropy_estimates(
    log_p: np.ndarray, log_q: np.ndarray | None = None, clip: float = DEFAULT_WEIGHT_CLIP
) -> np.ndarray:
    """Running importance-weighted PE estimates ``H_N`` for ``N = 1..n`` along the last axis.

    ``H_N = -(1/N) sum_{n<=N} w_n log p(y_n)``, ``w_n = clip(p(y_n)/q(y_n))``; ``log_q=None``
    means the samples came from ``p`` itself (``w = 1``).

    Returns
    -------
    np.ndarray
        Same shape as ``log_p``.

    Example
    -------
    >>> predictive_entropy_estimates(np.array([-1.0, -3.0])).tolist()
    [1.0, 2.0]
    """
    lp = np.asarray(log_p, dtype=np.float64)
    w = np.ones_like(lp) if log_q is None else importance_weights(lp, log_q, clip)
    n = np.arange(1, lp.shape[-1] + 1)
    return -np.cumsum(w * lp, axis=-1) / n


def max_estimates(log_p: np.ndarray) -> np.ndarray:
    """Running estimates ``M_N = -max_{n<=N} log p(y_n)`` along the last axis.

    Example
    -------
    >>> max_estimates(np.array([-2.0, -1.0, -3.0])).tolist()
    [2.0, 1.0, 1.0]
    """
    return -np.maximum.accumulate(np.asarray(log_p, dtype=np.float64), axis=-1)


@dataclass(frozen=True)
class BeamResult:
    """Outcome of :func:`beam_search`.

    Attributes
    ----------
    tokens:
        ``(T,)`` the best sequence in the final beam.
    log_p:
        Its log-probability; ``-log_p`` is the beam estimate of ``M(p)``.
    """

    tokens: np.ndarray
    log_p: float


def beam_search(tree: PrefixTreeDistribution, width: int) -> BeamResult:
    """Beam search on ``log p`` keeping the ``width`` best prefixes per step (``width=1``: greedy).

    Ties between equal scores are broken arbitrarily (they have probability zero for continuous
    Dirichlet draws). The estimate of ``M`` is ``-log p`` of the best sequence in the final beam.

    Example
    -------
    >>> from gnll.simulation.distributions import PrefixTreeDistribution
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> beam_search(tree, 1).tokens.tolist(), beam_search(tree, 2).tokens.tolist()
    ([0, 0], [1, 0])
    """
    if int(width) != width or width < 1:
        raise ValueError(f"beam width must be a positive integer, got {width!r}")
    v = tree.vocab_size
    node = np.zeros(1, dtype=np.int64)
    score = np.zeros(1)
    seqs = np.zeros((1, 0), dtype=np.int64)
    for t in range(tree.length):
        cand = (score[:, None] + tree.next_token_log_probs(t, node)).ravel()
        k = min(int(width), cand.size)
        if k == 1:
            top = np.array([np.argmax(cand)])
        elif k < cand.size:
            top = np.argpartition(-cand, k - 1)[:k]
        else:
            top = np.arange(cand.size)
        parent, tok = np.divmod(top, v)
        node = node[parent] * v + tok
        score = cand[top]
        seqs = np.concatenate([seqs[parent], tok[:, None]], axis=1)
    best = int(np.argmax(score))
    return BeamResult(tokens=seqs[best], log_p=float(score[best]))


def beam_search_estimates(tree: PrefixTreeDistribution, max_width: int) -> np.ndarray:
    """``M`` estimates ``-log p(beam_W)`` for beam widths ``W = 1..max_width`` (index 0 = greedy).

    Example
    -------
    >>> from gnll.simulation.distributions import PrefixTreeDistribution
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> np.exp(-beam_search_estimates(tree, 2)).round(2).tolist()
    [0.3, 0.36]
    """
    if int(max_width) != max_width or max_width < 1:
        raise ValueError(f"max_width must be a positive integer, got {max_width!r}")
    return np.array([-beam_search(tree, w).log_p for w in range(1, int(max_width) + 1)])
