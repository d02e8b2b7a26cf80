"""Synthetic sequence distributions ``p(y)`` as prefix trees of Dirichlet next-token draws.

A distribution over ``y = (y_1..y_T)`` with ``y_t`` in a vocabulary of size ``V`` is stored as its
next-token distributions: ``levels[t]`` has shape ``(V**t, V)`` and row ``u`` holds
``log p(y_{t+1} = v | prefix u)``, where a prefix ``(y_1..y_t)`` is numbered in base ``V``
(``u = sum_i y_i V**(t-1-i)``), so the children of ``u`` are ``u*V + v``.

Exact ``H(p)`` and ``M(p) = -max_y log p(y)`` never enumerate the ``V**T`` sequences: both decompose
over the tree, bottom-up, one level at a time::

    H(u) = sum_v p(v|u) [-log p(v|u) + H(uv)]        M*(u) = max_v [log p(v|u) + M*(uv)]

:func:`enumerate_log_probs` is the brute-force reference used by the tests.

For large trees (``V=100, T=4`` has 10**6 last-level rows) the last level can be a *leaf pool*: each
last-level node picks one of ``K`` pre-drawn Dirichlet rows (see :class:`LeafPool` and
``docs/simulation.md`` for why and what it changes).

Why one module of ~590 lines: the tree's layout (base-``V`` numbering of prefixes), its sampling
and the exact bottom-up recursions depend on each other's indexing; keeping them together keeps that
one convention in one place, next to the brute-force reference that tests it.

Example
-------
>>> import numpy as np
>>> tree = sample_tree(20, 3, np.random.default_rng(0))
>>> ev = exact_values(tree)
>>> lp = enumerate_log_probs(tree)
>>> bool(abs(ev.entropy + (np.exp(lp) * lp).sum()) < 1e-9)
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ExactValues",
    "LeafPool",
    "PrefixTreeDistribution",
    "enumerate_log_probs",
    "exact_values",
    "log_softmax",
    "make_leaf_pool",
    "paper_alphas",
    "path_extreme",
    "row_entropy",
    "sample_dirichlet_log_probs",
    "sample_tree",
    "sequence_log_prob",
]

RowFn = Callable[[np.ndarray], np.ndarray]

_ROW_CHUNK = 1 << 15  # rows processed at once when reducing big levels (bounds temporaries)


def paper_alphas(vocab_size: int) -> np.ndarray:
    """Dirichlet concentration parameters of the paper (App. C), before shuffling.

    ``|V|=20``: alpha 10 for two tokens, 0.2 for the other 18. ``|V|=100``: 10 for two, 1 for four,
    0.2 for 94. Other sizes extrapolate (our choice, not the paper's): ``V < 100`` uses the
    20-scheme, ``V >= 100`` the 100-scheme, padding with 0.2.

    Parameters
    ----------
    vocab_size:
        Vocabulary size ``V >= 2``.

    Returns
    -------
    np.ndarray
        Shape ``(V,)``, float64, sorted descending.

    Example
    -------
    >>> paper_alphas(20)[:3].tolist()
    [10.0, 10.0, 0.2]
    """
    if int(vocab_size) != vocab_size or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    head = [10.0, 10.0] if vocab_size < 100 else [10.0, 10.0, 1.0, 1.0, 1.0, 1.0]
    head = head[:vocab_size]
    return np.array(head + [0.2] * (vocab_size - len(head)), dtype=np.float64)


def _check_alphas(alphas: np.ndarray | list[float]) -> np.ndarray:
    arr = np.asarray(alphas, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(
            f"alphas must be a 1-D array with at least 2 entries, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError("alphas must be finite and > 0")
    return arr


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable ``log softmax`` along ``axis``.

    Example
    -------
    >>> np.exp(log_softmax(np.array([0.0, np.log(3.0)]))).round(3).tolist()
    [0.25, 0.75]
    """
    z = np.asarray(logits, dtype=np.float64)
    m = np.max(z, axis=axis, keepdims=True)
    return z - (m + np.log(np.sum(np.exp(z - m), axis=axis, keepdims=True)))


def row_entropy(log_probs: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of a log-probability array ``(..., V)``.

    Example
    -------
    >>> float(row_entropy(np.log(np.array([[0.5, 0.5]])))[0]) == float(np.log(2))
    True
    """
    lp = np.asarray(log_probs, dtype=np.float64)
    p = np.exp(lp)
    return -np.sum(np.where(p > 0, p * lp, 0.0), axis=-1)


def sample_dirichlet_log_probs(
    alphas: np.ndarray | list[float],
    n_rows: int,
    rng: np.random.Generator,
    *,
    shuffle: bool = True,
) -> np.ndarray:
    """Draw ``n_rows`` Dirichlet(``alphas``) vectors, returned as log-probabilities.

    With ``shuffle=True`` the alpha vector is randomly permuted independently for each row, as in
    App. C. Implementation: all ``V`` entries are first drawn from the most frequent alpha (the
    i.i.d. "tail"), then the remaining ``k`` entries are drawn from their own alphas and written to
    ``k`` uniformly random distinct positions (partial Fisher-Yates on an index array). Because the
    tail entries are i.i.d., this has exactly the law of a full per-row shuffle at a fraction of
    the cost.

    Parameters
    ----------
    alphas:
        Concentration parameters, shape ``(V,)``, all > 0.
    n_rows:
        Number of independent draws (>= 0).
    rng:
        Source of randomness.
    shuffle:
        Permute the alphas per row (default); if False the non-tail alphas sit at positions
        ``0..k-1``.

    Returns
    -------
    np.ndarray
        ``(n_rows, V)`` float64 log-probabilities; every row log-sum-exps to 0.

    Example
    -------
    >>> lp = sample_dirichlet_log_probs(paper_alphas(20), 4, np.random.default_rng(0))
    >>> lp.shape, bool(np.allclose(np.exp(lp).sum(1), 1))
    ((4, 20), True)
    """
    a = _check_alphas(alphas)
    if int(n_rows) != n_rows or n_rows < 0:
        raise ValueError(f"n_rows must be a non-negative integer, got {n_rows!r}")
    n_rows = int(n_rows)
    v = a.size
    values, counts = np.unique(a, return_counts=True)
    tail = values[np.argmax(counts)]
    special = np.flatnonzero(a != tail)
    special = special[np.argsort(-a[special], kind="stable")]
    k = special.size
    g = rng.standard_gamma(tail, size=(n_rows, v))
    if k:
        gs = np.empty((n_rows, k))
        for value in np.unique(a[special]):
            cols = np.flatnonzero(a[special] == value)
            gs[:, cols] = rng.standard_gamma(value, size=(n_rows, cols.size))
        if shuffle:
            rows = np.arange(n_rows)
            idx = np.broadcast_to(np.arange(v, dtype=np.int64), (n_rows, v)).copy()
            for j in range(k):
                r = rng.integers(j, v, size=n_rows)
                tmp = idx[rows, r]
                idx[rows, r] = idx[:, j]
                idx[:, j] = tmp
            pos = idx[:, :k]
        else:
            pos = np.broadcast_to(np.arange(k), (n_rows, k))
        np.put_along_axis(g, pos, gs, axis=1)
    logg = np.log(np.maximum(g, np.finfo(np.float64).tiny))
    return logg - np.log(np.sum(g, axis=1, keepdims=True))


def _f64_rows(rows: np.ndarray) -> np.ndarray:
    """Rows of log-probs as float64; reduced-precision storage is renormalised after upcasting.

    A float32 row only sums to one within ~1e-7; renormalising in float64 makes every stored tree an
    exactly normalised distribution, so the tree decomposition and enumeration agree to round-off.
    """
    if rows.dtype == np.float64:
        return rows
    return log_softmax(np.asarray(rows, dtype=np.float64))


def _apply_rows(array: np.ndarray, fn: RowFn, chunk: int = _ROW_CHUNK) -> np.ndarray:
    """``fn`` applied to row chunks of a 2-D array (as float64 rows), concatenated."""
    out = [fn(_f64_rows(array[i : i + chunk])) for i in range(0, len(array), chunk)]
    return np.concatenate(out) if out else np.empty(0)


@dataclass(frozen=True, eq=False)
class LeafPool:
    """``K`` pre-drawn next-token distributions shared by the last level of large trees.

    Attributes
    ----------
    log_probs:
        ``(K, V)`` log-probabilities (float32 to halve memory; read back as float64 and
        renormalised, so every pooled row is an exactly normalised distribution).

    Row statistics (entropy, max, ...) are computed once per pool and cached
    (:meth:`row_statistic`), so a tree with ``10**6`` last-level nodes costs a gather, not a
    reduction.
    """

    log_probs: np.ndarray
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.log_probs.ndim != 2 or self.log_probs.shape[0] < 1 or self.log_probs.shape[1] < 2:
            raise ValueError(f"log_probs must have shape (K>=1, V>=2), got {self.log_probs.shape}")

    @property
    def size(self) -> int:
        """Number of pooled rows ``K``."""
        return int(self.log_probs.shape[0])

    @property
    def vocab_size(self) -> int:
        """Vocabulary size ``V``."""
        return int(self.log_probs.shape[1])

    def row_statistic(self, key: str, fn: RowFn) -> np.ndarray:
        """``fn(row)`` for every pooled row, cached under ``key`` (shape ``(K,)``)."""
        if key not in self._cache:
            self._cache[key] = _apply_rows(self.log_probs, fn)
        return self._cache[key]


def make_leaf_pool(
    vocab_size: int,
    size: int,
    rng: np.random.Generator,
    alphas: np.ndarray | list[float] | None = None,
    *,
    chunk: int = 1 << 16,
) -> LeafPool:
    """Draw a :class:`LeafPool` of ``size`` Dirichlet rows (shuffled alphas), stored as float32.

    Example
    -------
    >>> make_leaf_pool(20, 8, np.random.default_rng(0)).log_probs.shape
    (8, 20)
    """
    a = paper_alphas(vocab_size) if alphas is None else _check_alphas(alphas)
    if a.size != vocab_size:
        raise ValueError(f"len(alphas)={a.size} != vocab_size={vocab_size}")
    if int(size) != size or size < 1:
        raise ValueError(f"leaf pool size must be a positive integer, got {size!r}")
    out = np.empty((int(size), vocab_size), dtype=np.float32)
    for i in range(0, int(size), chunk):
        n = min(chunk, int(size) - i)
        out[i : i + n] = sample_dirichlet_log_probs(a, n, rng)
    return LeafPool(out)


@dataclass(frozen=True, eq=False)
class PrefixTreeDistribution:
    """A distribution over ``V**T`` sequences given by its next-token distributions.

    Attributes
    ----------
    vocab_size, length:
        ``V`` and ``T``.
    levels:
        ``levels[t]``: ``(V**t, V)`` next-token log-probs after every depth-``t`` prefix. All ``T``
        levels are present, or only the first ``T-1`` when a leaf pool is used.
    leaf_pool, leaf_index:
        Optional: the last level is ``leaf_pool.log_probs[leaf_index]`` (``leaf_index`` has shape
        ``(V**(T-1),)``).

    Example
    -------
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> round(float(np.exp(sequence_log_prob(tree, [1, 0]))), 3)
    0.36
    """

    vocab_size: int
    length: int
    levels: tuple[np.ndarray, ...]
    leaf_pool: LeafPool | None = None
    leaf_index: np.ndarray | None = None

    def __post_init__(self) -> None:
        v, t_len = self.vocab_size, self.length
        if int(v) != v or v < 2:
            raise ValueError(f"vocab_size must be an integer >= 2, got {v!r}")
        if int(t_len) != t_len or t_len < 1:
            raise ValueError(f"length must be an integer >= 1, got {t_len!r}")
        pooled = self.leaf_pool is not None
        if pooled != (self.leaf_index is not None):
            raise ValueError("leaf_pool and leaf_index must be given together")
        expected = t_len - 1 if pooled else t_len
        if len(self.levels) != expected:
            raise ValueError(f"expected {expected} explicit levels, got {len(self.levels)}")
        for t, lv in enumerate(self.levels):
            if lv.shape != (v**t, v):
                raise ValueError(f"levels[{t}] must have shape {(v**t, v)}, got {lv.shape}")
        if pooled:
            assert self.leaf_pool is not None and self.leaf_index is not None
            if self.leaf_pool.vocab_size != v:
                raise ValueError("leaf_pool vocabulary size differs from the tree's")
            if self.leaf_index.shape != (v ** (t_len - 1),):
                raise ValueError(f"leaf_index must have shape {(v ** (t_len - 1),)}")
            if self.leaf_index.min() < 0 or self.leaf_index.max() >= self.leaf_pool.size:
                raise ValueError("leaf_index out of range of the leaf pool")

    @classmethod
    def from_probabilities(cls, levels: list) -> PrefixTreeDistribution:
        """Build a tree from explicit next-token probabilities ``levels[t]`` of shape ``(V**t, V)``.

        Rows must be non-negative and sum to 1 (tolerance 1e-9); zeros become ``log 0 = -inf``.
        """
        arrs = [np.asarray(lv, dtype=np.float64) for lv in levels]
        if not arrs or arrs[0].ndim != 2:
            raise ValueError("levels must be a non-empty list of 2-D arrays")
        v = arrs[0].shape[1]
        for t, lv in enumerate(arrs):
            if np.any(lv < 0) or not np.allclose(lv.sum(axis=-1), 1.0, atol=1e-9):
                raise ValueError(f"levels[{t}] rows must be probability vectors")
        with np.errstate(divide="ignore"):
            logs = tuple(np.log(lv) for lv in arrs)
        return cls(vocab_size=v, length=len(arrs), levels=logs)

    @property
    def n_sequences(self) -> int:
        """``V**T``."""
        return int(self.vocab_size**self.length)

    def next_token_log_probs(self, depth: int, nodes: np.ndarray) -> np.ndarray:
        """Next-token log-probs ``(len(nodes), V)`` (float64) after depth-``depth`` nodes."""
        if not 0 <= depth < self.length:
            raise ValueError(f"depth must be in [0, {self.length}), got {depth}")
        nodes = np.asarray(nodes, dtype=np.int64)
        if depth < len(self.levels):
            return _f64_rows(self.levels[depth][nodes])
        assert self.leaf_pool is not None and self.leaf_index is not None
        return _f64_rows(self.leaf_pool.log_probs[self.leaf_index[nodes]])

    def leaf_statistic(self, key: str, fn: RowFn) -> np.ndarray:
        """``fn`` of every last-level row, shape ``(V**(T-1),)`` (cached for pooled leaves)."""
        if self.leaf_pool is not None:
            assert self.leaf_index is not None
            return self.leaf_pool.row_statistic(key, fn)[self.leaf_index]
        return _apply_rows(self.levels[-1], fn)


def sample_tree(
    vocab_size: int,
    length: int,
    rng: np.random.Generator,
    alphas: np.ndarray | list[float] | None = None,
    *,
    leaf_pool: LeafPool | None = None,
    level_dtype: type = np.float64,
) -> PrefixTreeDistribution:
    """Draw a random sequence distribution: an independent Dirichlet row for every prefix.

    Parameters
    ----------
    vocab_size, length:
        ``V >= 2`` and ``T >= 1``.
    rng:
        Source of randomness (the same generator state gives the same tree).
    alphas:
        Concentration parameters (default :func:`paper_alphas`), shuffled per row.
    leaf_pool:
        If given, the last level picks rows of the pool uniformly at random (i.i.d. per node)
        instead of drawing ``V**(T-1)`` fresh rows.
    level_dtype:
        Storage dtype of the explicit levels (float32 halves memory for very large trees).

    Returns
    -------
    PrefixTreeDistribution

    Example
    -------
    >>> sample_tree(20, 2, np.random.default_rng(1)).levels[1].shape
    (20, 20)
    """
    a = paper_alphas(vocab_size) if alphas is None else _check_alphas(alphas)
    if a.size != vocab_size:
        raise ValueError(f"len(alphas)={a.size} != vocab_size={vocab_size}")
    if int(length) != length or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    if leaf_pool is not None and leaf_pool.vocab_size != vocab_size:
        raise ValueError("leaf_pool vocabulary size differs from vocab_size")
    n_explicit = length - 1 if leaf_pool is not None else length
    levels = []
    for t in range(n_explicit):
        n = vocab_size**t
        lv = np.empty((n, vocab_size), dtype=level_dtype)
        for i in range(0, n, _ROW_CHUNK):
            m = min(_ROW_CHUNK, n - i)
            lv[i : i + m] = sample_dirichlet_log_probs(a, m, rng)
        levels.append(lv)
    leaf_index = None
    if leaf_pool is not None:
        leaf_index = rng.integers(
            0, leaf_pool.size, size=vocab_size ** (length - 1), dtype=np.int64
        )
    return PrefixTreeDistribution(vocab_size, length, tuple(levels), leaf_pool, leaf_index)


def _leaf_max(rows: np.ndarray) -> np.ndarray:
    return rows.max(axis=1)


def _leaf_min(rows: np.ndarray) -> np.ndarray:
    return rows.min(axis=1)


@dataclass(frozen=True)
class ExactValues:
    """Exact functionals of ``p(y)``.

    Attributes
    ----------
    entropy:
        ``H(p) = -sum_y p(y) log p(y)`` (nats).
    min_entropy:
        ``M(p) = -max_y log p(y)`` (nats).
    """

    entropy: float
    min_entropy: float

    @property
    def max_log_prob(self) -> float:
        """``max_y log p(y) = -M(p)``."""
        return -self.min_entropy


def path_extreme(
    tree: PrefixTreeDistribution,
    edge: RowFn | None = None,
    *,
    mode: str = "max",
    key: str | None = None,
) -> float:
    """``max_y`` (or ``min_y``) of ``sum_t edge(row_t)[y_t]`` over all sequences, by DP.

    With ``edge=None`` the edge weight is the log-probability, so ``mode="max"`` gives
    ``max_y log p(y)`` and ``mode="min"`` gives ``min_y log p(y)``.

    Parameters
    ----------
    tree:
        The distribution.
    edge:
        Maps next-token log-prob rows ``(n, V)`` to edge weights ``(n, V)``.
    mode:
        ``"max"`` or ``"min"``.
    key:
        Cache key for pooled leaves (required when ``edge`` is given and the tree uses a leaf pool).

    Example
    -------
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> round(float(np.exp(path_extreme(tree))), 3)
    0.36
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    red = np.max if mode == "max" else np.min
    if edge is None:
        leaf = tree.leaf_statistic(mode, _leaf_max if mode == "max" else _leaf_min)
    else:
        if tree.leaf_pool is not None and key is None:
            raise ValueError("key is required for a custom edge function on a pooled tree")
        leaf = tree.leaf_statistic(f"{key}:{mode}", lambda r: red(edge(r), axis=1))
    v = tree.vocab_size
    vals = leaf
    for t in range(tree.length - 2, -1, -1):
        rows = _f64_rows(tree.levels[t])
        w = rows if edge is None else edge(rows)
        vals = red(w + vals.reshape(v**t, v), axis=1)
    return float(vals[0])


def exact_values(tree: PrefixTreeDistribution) -> ExactValues:
    """Exact ``H(p)`` and ``M(p)`` by bottom-up reduction over the prefix tree.

    Cost is one pass over the stored next-token rows (``O(V**T)`` flops, ``O(V**(T-1))`` extra
    memory); with a leaf pool the last level costs a gather of cached per-row statistics.

    Example
    -------
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.5, 0.5]]])
    >>> ev = exact_values(tree)
    >>> round(ev.entropy, 6), round(ev.min_entropy, 6)
    (0.693147, 0.693147)
    """
    v = tree.vocab_size
    h = tree.leaf_statistic("entropy", row_entropy)
    m = tree.leaf_statistic("max", _leaf_max)
    for t in range(tree.length - 2, -1, -1):
        rows = _f64_rows(tree.levels[t])
        p = np.exp(rows)
        h = np.sum(p * (np.where(p > 0, -rows, 0.0) + h.reshape(v**t, v)), axis=1)
        m = np.max(rows + m.reshape(v**t, v), axis=1)
    return ExactValues(entropy=float(h[0]), min_entropy=float(-m[0]))


def enumerate_log_probs(
    tree: PrefixTreeDistribution, temperature: float | None = None, *, limit: int = 10**7
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Brute force: ``log p(y)`` for all ``V**T`` sequences in base-``V`` order.

    Parameters
    ----------
    tree:
        The distribution.
    temperature:
        If given, also return ``log q(y)`` of the per-step tempered proposal
        ``q(v|u) ∝ p(v|u)**(1/temperature)``.
    limit:
        Refuse trees with more than ``limit`` sequences (memory guard).

    Returns
    -------
    np.ndarray or (np.ndarray, np.ndarray)
        ``log_p`` of shape ``(V**T,)``, or ``(log_p, log_q)``.

    Example
    -------
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> np.exp(enumerate_log_probs(tree)).round(2).tolist()
    [0.3, 0.3, 0.36, 0.04]
    """
    if tree.n_sequences > limit:
        raise ValueError(f"refusing to enumerate {tree.n_sequences} sequences (limit {limit})")
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    v = tree.vocab_size
    lp = np.zeros(1)
    lq = np.zeros(1)
    for t in range(tree.length):
        rows = tree.next_token_log_probs(t, np.arange(v**t))
        lp = (lp[:, None] + rows).ravel()
        if temperature is not None:
            lq = (lq[:, None] + log_softmax(rows / temperature)).ravel()
    return lp if temperature is None else (lp, lq)


def sequence_log_prob(
    tree: PrefixTreeDistribution, tokens: np.ndarray | list[int]
) -> np.ndarray | float:
    """``log p(y)`` of one sequence (shape ``(T,)``, returns a float) or of ``(n, T)`` sequences.

    Example
    -------
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> round(float(np.exp(sequence_log_prob(tree, [0, 1]))), 2)
    0.3
    """
    tok = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    if tok.shape[1] != tree.length:
        raise ValueError(f"sequences must have length {tree.length}, got {tok.shape[1]}")
    if tok.min() < 0 or tok.max() >= tree.vocab_size:
        raise ValueError("token ids out of range")
    node = np.zeros(len(tok), dtype=np.int64)
    out = np.zeros(len(tok))
    for t in range(tree.length):
        rows = tree.next_token_log_probs(t, node)
        out += rows[np.arange(len(tok)), tok[:, t]]
        node = node * tree.vocab_size + tok[:, t]
    return out if np.ndim(tokens) == 2 else float(out[0])
