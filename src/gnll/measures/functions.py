"""Uncertainty measures as pure functions of token log-probabilities.

Every function here takes per-token log-probabilities under the model's own (temperature-1, unwarped)
next-token distribution -- one sequence of floats per generated output -- and returns a float where
**higher means more uncertain**. Nothing here knows about models; see :mod:`gnll.backends` for how the
log-probabilities are produced.

Notation: for an output ``y = (y_1..y_T)``, ``log p(y|x) = sum_t log p(y_t | x, y_<t)``.

**Empty answers.** Pass a :class:`gnll.backends.Generation` (or its ``measured_logprobs``), not its
raw ``token_logprobs``: an answer without tokens (the model stopped at once) is then scored by the
log-prob of the token that ended it, never as "log-likelihood 0, maximally certain". Every gnll
surface follows this one rule. A bare empty sequence ``[]`` is the empty product (log-likelihood 0).

**Range.** Every measure is finite and ``>= 0`` for valid log-probs, and never ``-0.0``. A token
log-prob must be finite, ``<= 0`` and above ``-9999`` (at or below it is the stand-in servers send
for -inf): otherwise a ``ValueError`` (:class:`~gnll.measures.LogprobError`) names the token and the
bound (:func:`~gnll.measures.check_logprobs`). Means and cluster probabilities are computed so that
no intermediate sum overflows, and a sequence log-likelihood below ``-1.8e308`` (the float64 limit)
would be a ``ValueError`` naming that bound, never ``inf`` or ``nan``.

Example
-------
>>> from gnll import measures
>>> round(measures.g_nll([-0.1, -0.5, -0.02]), 4)
0.62
>>> round(measures.predictive_entropy([[-0.1, -0.5], [-2.0]]), 4)
1.3
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import logsumexp

from gnll.measures.logprobs import check_logprobs

TokenLogprobs = Sequence[float] | np.ndarray

__all__ = [
    "G_NLL_EOS",
    "g_nll",
    "g_nll_eos",
    "ln_g_nll",
    "sequence_logprob",
    "msp_estimate",
    "predictive_entropy",
    "ln_predictive_entropy",
    "semantic_entropy",
    "ln_semantic_entropy",
    "semantic_entropy_plugin",
    "ln_semantic_entropy_plugin",
    "discrete_semantic_entropy",
    "max_cluster_probability",
    "cluster_log_probs",
    "TokenLogprobs",
]

_FLOAT_MAX = float(np.finfo(np.float64).max)


def _nonneg(x: float) -> float:
    """``x`` as a plain float, with a -0.0 turned into 0.0 (no measure reports a negative zero)."""
    return float(x) + 0.0


def _as_logprobs(token_logprobs: TokenLogprobs, *, name: str = "token_logprobs") -> np.ndarray:
    """Validate one sequence of token log-probs and return it as a float64 array (no -0.0).

    A :class:`~gnll.backends.Generation` gives its ``measured_logprobs`` (the empty-answer rule).
    """
    token_logprobs = getattr(token_logprobs, "measured_logprobs", token_logprobs)
    return check_logprobs(token_logprobs, where=name) + 0.0


def _as_batch(list_of_token_logprobs: Sequence[TokenLogprobs]) -> list[np.ndarray]:
    if isinstance(list_of_token_logprobs, np.ndarray) and list_of_token_logprobs.ndim == 1:
        raise ValueError(
            "expected one sequence of token log-probs per output (a list of sequences), got a flat array; "
            "wrap a single output as [token_logprobs]"
        )
    seqs = [
        _as_logprobs(s, name=f"list_of_token_logprobs[{i}]")
        for i, s in enumerate(list_of_token_logprobs)
    ]
    if not seqs:
        raise ValueError(
            "list_of_token_logprobs is empty: at least one generated output is required"
        )
    return seqs


def _loglik(arr: np.ndarray, name: str = "token_logprobs") -> float:
    """The sum of one output's token log-probs; a ``ValueError`` where it leaves float64's range."""
    # math.fsum is correctly rounded, so the sum of a prefix of non-positive log-probs is never below
    # the whole sequence's: a running G-NLL never exceeds the final one, even in the last bit (NumPy's
    # pairwise sum groups a prefix and the whole differently). Early decisions rely on it
    # (:mod:`gnll.measures.early`).
    try:
        total = math.fsum(arr.tolist())
    except OverflowError:
        total = -math.inf
    if not np.isfinite(total):
        raise ValueError(
            f"{name}: the sequence log-likelihood (sum of {arr.size} token log-probs) is below "
            f"-{_FLOAT_MAX:.3g}, the float64 limit, and cannot be represented"
        )
    return total


def _seq_logliks(seqs: list[np.ndarray], *, normalize: bool) -> np.ndarray:
    if normalize:
        return np.array([_mean(s) for s in seqs])
    return np.array([_loglik(s, f"list_of_token_logprobs[{i}]") for i, s in enumerate(seqs)])


def _mean(values: np.ndarray) -> float:
    # np.mean sums first and overflows near -1.8e308; the mean of values scaled into [-1, 1],
    # scaled back, stays within the largest |value| (rounding is monotonic).
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    if scale == 0.0:
        return 0.0
    return float(np.mean(values / scale)) * scale


def _as_cluster_ids(cluster_ids: Sequence[int] | np.ndarray, n: int | None = None) -> np.ndarray:
    ids = np.asarray(cluster_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(
            f"cluster_ids must be a non-empty 1-D sequence of ints, got shape {ids.shape}"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"cluster_ids must be integers, got dtype {ids.dtype}")
    if n is not None and ids.size != n:
        raise ValueError(
            f"cluster_ids has {ids.size} entries but there are {n} outputs; give one cluster id per output"
        )
    return ids


def sequence_logprob(token_logprobs: TokenLogprobs) -> float:
    """Sequence log-likelihood ``log p(y|x) = sum_t log p(y_t|x, y_<t)`` (0 for an empty sequence)."""
    return _nonneg(_loglik(_as_logprobs(token_logprobs)))


def g_nll(token_logprobs: TokenLogprobs) -> float:
    """G-NLL: negative log-likelihood of the greedily decoded output.

    Parameters
    ----------
    token_logprobs:
        Log-probabilities of the greedy output's tokens, one per token.

    Returns
    -------
    float
        ``-sum_t log p(y_t | x, y_<t)``, >= 0. Higher means more uncertain.

    Examples
    --------
    >>> g_nll([-0.5, -0.25])
    0.75
    """
    return _nonneg(0.0 - sequence_logprob(token_logprobs))


#: The name of :func:`g_nll_eos`, LM-Polygraph's ``MaximumSequenceProbability`` definition of the
#: greedy answer's NLL (a named variant: gnll's G-NLL excludes the terminator, gnll's choice, as
#: Farquhar et al.'s code; the paper's Eq. 9 does not say).
G_NLL_EOS = "g-nll+eos"


def g_nll_eos(
    token_logprobs: TokenLogprobs,
    terminator_logprobs: TokenLogprobs,
    masked_logprobs: TokenLogprobs = (),
) -> float:
    """G-NLL with the terminator: ``-(sum of the answer's and its stop tokens' log-probs)``.

    This is LM-Polygraph's ``MaximumSequenceProbability``: the negated sum of the greedy sequence's
    log-probs up to and including the token that ended it (the EOS token, or the token(s) of a
    stop string). gnll's :func:`g_nll` leaves the terminator out (gnll's choice, as Farquhar et
    al.'s code; the paper's Eq. 9 does not say); the two differ by the terminator's NLL on every
    answer that has one (an answer cut by ``max_new_tokens`` has none). An empty answer is its
    terminator alone (no double counting with the empty-answer rule).

    LM-Polygraph generates with ``min_new_tokens=2``: EOS is masked in the first two steps
    *before* the token is chosen and the log-probs are recorded. ``masked_logprobs`` (the EOS
    log-prob at each of those steps) renormalises them, ``log p - log(1 - p_masked)``; LM-Polygraph
    leaves EOS the row's smallest finite logit, so its exact value is ``log p - log(1 - p_masked +
    p_min)``, the same to within the least likely token's probability. **Parity needs EOS not to be
    the greedy token at step 1 or 2**: where it is (an empty answer, or one token ended by EOS),
    LM-Polygraph cannot choose it and generates another, longer answer, so no renormalisation of
    this answer's log-probs gives its MSP (``gnll eval`` counts such answers, ``eos_at_step_le_2``
    in ``results.json``). ``scripts/polygraph_fixture.py`` records LM-Polygraph's numbers on the
    embedded model for ``tests/evaluation/test_polygraph_parity.py``, with gnll's stop strings and
    with LM-Polygraph's own defaults (chat template, EOS only).

    Parameters
    ----------
    token_logprobs:
        The answer tokens' log-probs (``Generation.token_logprobs``; empty for an empty answer).
    terminator_logprobs:
        The log-probs of the token(s) that ended it (``Generation.terminator_logprobs``).
    masked_logprobs:
        Per leading step, the log-prob of what was masked there (LM-Polygraph: EOS in steps 1-2).

    Examples
    --------
    >>> g_nll_eos([-0.5, -0.25], [-0.125])
    0.875
    >>> g_nll_eos([], [-2.5, -0.5])
    3.0
    >>> round(g_nll_eos([-1.0], [-0.5], masked_logprobs=[-9.0, math.log(0.25)]), 6)
    1.212195
    """
    lps = _as_logprobs([*token_logprobs, *terminator_logprobs]).copy()
    masked = _as_logprobs(masked_logprobs, name="masked_logprobs")[: lps.size]
    # Renormalise a step without the masked mass: log p - log(1 - p_masked).
    lps[: masked.size] -= np.log1p(-np.exp(masked))
    return _nonneg(0.0 - sequence_logprob(lps))


def ln_g_nll(token_logprobs: TokenLogprobs) -> float:
    """Length-normalised G-NLL: ``-(1/T) sum_t log p(y_t|...)``; 0 for an empty output.

    Examples
    --------
    >>> ln_g_nll([-0.5, -0.25])
    0.375
    """
    arr = _as_logprobs(token_logprobs)
    return _nonneg(0.0 - _mean(arr)) if arr.size else 0.0


def msp_estimate(list_of_token_logprobs: Sequence[TokenLogprobs]) -> float:
    """Estimate of ``-max_y log p(y|x)`` from N candidate outputs (beams or samples).

    Returns ``-max_n log p(y^n|x)``: never larger than any candidate's NLL.

    Examples
    --------
    >>> msp_estimate([[-0.5, -0.25], [-0.1]])
    0.1
    """
    seqs = _as_batch(list_of_token_logprobs)
    return _nonneg(0.0 - _seq_logliks(seqs, normalize=False).max())


def predictive_entropy(list_of_token_logprobs: Sequence[TokenLogprobs]) -> float:
    """Monte-Carlo predictive entropy ``(1/N) sum_n -log p(y^n|x)`` over N sampled outputs.

    Examples
    --------
    >>> predictive_entropy([[-1.0, -1.0], [-0.5]])
    1.25
    """
    seqs = _as_batch(list_of_token_logprobs)
    return _nonneg(0.0 - _mean(_seq_logliks(seqs, normalize=False)))


def ln_predictive_entropy(list_of_token_logprobs: Sequence[TokenLogprobs]) -> float:
    """Length-normalised predictive entropy ``(1/N) sum_n -(1/T_n) log p(y^n|x)``.

    Examples
    --------
    >>> ln_predictive_entropy([[-1.0, -1.0], [-0.5]])
    0.75
    """
    seqs = _as_batch(list_of_token_logprobs)
    return _nonneg(0.0 - _mean(_seq_logliks(seqs, normalize=True)))


def cluster_log_probs(
    list_of_token_logprobs: Sequence[TokenLogprobs],
    cluster_ids: Sequence[int] | np.ndarray,
    *,
    normalize_length: bool = False,
) -> np.ndarray:
    """Log-probability of each semantic cluster, normalised over the N outputs.

    ``log p(c) = logsumexp_{n in c} log p(y^n|x) - logsumexp_n log p(y^n|x)`` (Farquhar et al. 2024).
    Outputs that occur several times among the samples count once per occurrence, as in the reference
    implementation. Returns one entry per distinct cluster id, in increasing id order.
    """
    seqs = _as_batch(list_of_token_logprobs)
    ids = _as_cluster_ids(cluster_ids, len(seqs))
    logliks = _seq_logliks(seqs, normalize=normalize_length)
    # p(c) does not change when every log-likelihood moves by one constant; moving the largest to 0
    # keeps log 2 from vanishing in the round-off of log-likelihoods near -1e308.
    logliks = logliks - logliks.max()
    uniq = np.unique(ids)
    per_cluster = np.array([logsumexp(logliks[ids == c]) for c in uniq])
    # both terms lie in [-1.8e308, log N], so their difference is finite; no cluster exceeds 1
    return np.minimum(per_cluster - logsumexp(logliks), 0.0) + 0.0


def _entropy_from_log_probs(log_p: np.ndarray) -> float:
    # p log p -> 0 as p -> 0; exp(log_p) underflows to 0 first, so each term stays finite.
    return _nonneg(max(0.0 - float(np.sum(np.exp(log_p) * log_p)), 0.0))


def _monte_carlo_entropy(
    list_of_token_logprobs: Sequence[TokenLogprobs],
    cluster_ids: Sequence[int] | np.ndarray,
    *,
    normalize_length: bool,
) -> float:
    ids = _as_cluster_ids(cluster_ids, len(list_of_token_logprobs))
    log_p = cluster_log_probs(list_of_token_logprobs, ids, normalize_length=normalize_length)
    # cluster_log_probs is ordered by increasing cluster id: look each sample's cluster up.
    per_sample = log_p[np.searchsorted(np.unique(ids), ids)]
    return _nonneg(max(0.0 - _mean(per_sample), 0.0))


def semantic_entropy(
    list_of_token_logprobs: Sequence[TokenLogprobs], cluster_ids: Sequence[int] | np.ndarray
) -> float:
    """Semantic entropy, the paper's Monte-Carlo form (Eq. 5): ``(1/N) sum_n -log p(c_n)``.

    ``c_n`` is the cluster of the n-th sampled answer, ``p(c)`` the likelihood-weighted cluster mass
    of :func:`cluster_log_probs`. On few samples it differs a lot from the plug-in form
    :func:`semantic_entropy_plugin` (Farquhar et al.'s code): 6 samples in one cluster holding 90% of
    the mass and 4 in another give ``0.6 * -log 0.9 + 0.4 * -log 0.1 = 0.984`` here, 0.325 there.

    Examples
    --------
    >>> semantic_entropy([[-1.0], [-1.0]], [0, 0])
    0.0
    >>> round(semantic_entropy([[-1.0], [-1.0]], [0, 1]), 4)  # two equally likely meanings
    0.6931
    """
    return _monte_carlo_entropy(list_of_token_logprobs, cluster_ids, normalize_length=False)


def ln_semantic_entropy(
    list_of_token_logprobs: Sequence[TokenLogprobs], cluster_ids: Sequence[int] | np.ndarray
) -> float:
    """:func:`semantic_entropy` (Monte-Carlo form) from length-normalised sequence log-likelihoods."""
    return _monte_carlo_entropy(list_of_token_logprobs, cluster_ids, normalize_length=True)


def semantic_entropy_plugin(
    list_of_token_logprobs: Sequence[TokenLogprobs], cluster_ids: Sequence[int] | np.ndarray
) -> float:
    """Semantic entropy, plug-in form ``-sum_c p(c) log p(c)`` over the clusters found.

    This is the Rao-Blackwellised estimator of Farquhar et al.'s code (``predictive_entropy_rao``);
    the paper's Eq. (5) writes the Monte-Carlo form :func:`semantic_entropy`.

    Examples
    --------
    >>> round(semantic_entropy_plugin([[-1.0], [-1.0]], [0, 1]), 4)
    0.6931
    """
    return _entropy_from_log_probs(cluster_log_probs(list_of_token_logprobs, cluster_ids))


def ln_semantic_entropy_plugin(
    list_of_token_logprobs: Sequence[TokenLogprobs], cluster_ids: Sequence[int] | np.ndarray
) -> float:
    """:func:`semantic_entropy_plugin` from length-normalised sequence log-likelihoods."""
    return _entropy_from_log_probs(
        cluster_log_probs(list_of_token_logprobs, cluster_ids, normalize_length=True)
    )


def discrete_semantic_entropy(cluster_ids: Sequence[int] | np.ndarray) -> float:
    """Entropy of the empirical cluster frequencies ``|c|/N``; ignores likelihoods.

    Examples
    --------
    >>> round(discrete_semantic_entropy([0, 1, 2, 3]), 4)  # log 4
    1.3863
    """
    ids = _as_cluster_ids(cluster_ids)
    _, counts = np.unique(ids, return_counts=True)
    freqs = counts / counts.sum()
    return _nonneg(max(0.0 - float(np.sum(freqs * np.log(freqs))), 0.0))


def max_cluster_probability(
    list_of_token_logprobs: Sequence[TokenLogprobs], cluster_ids: Sequence[int] | np.ndarray
) -> float:
    """MCP: ``-log max_c p(c)``, the semantic counterpart of the maximum sequence probability.

    Examples
    --------
    >>> round(max_cluster_probability([[-1.0], [-1.0], [-1.0]], [0, 0, 1]), 4)  # -log(2/3)
    0.4055
    """
    return _nonneg(
        max(0.0 - float(cluster_log_probs(list_of_token_logprobs, cluster_ids).max()), 0.0)
    )
