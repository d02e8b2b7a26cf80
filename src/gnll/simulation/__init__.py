"""Simulation study of Sec. 3 / App. B-C: estimating ``H(p)`` and ``M(p)`` with exact ground truth.

Modules
-------
``distributions``
    Dirichlet prefix-tree distributions ``p(y)``; exact ``H`` and ``M`` by tree decomposition;
    brute-force enumeration for tests.
``estimators``
    Multinomial sampling at temperature, importance-weighted PE, max-over-samples, beam search.
``theory``
    Theorem 1 bounds and their empirical check.
``study``
    :func:`run_study` (the full study, returns a JSON-able dict) and :class:`StudyConfig`.
``plots``
    Fig. 1a/1b and the appendix grids (imports matplotlib; not imported here).

Example
-------
>>> import numpy as np
>>> from gnll.simulation import sample_tree, exact_values, beam_search
>>> tree = sample_tree(20, 3, np.random.default_rng(0))
>>> ev = exact_values(tree)
>>> bool(-beam_search(tree, 20**2).log_p == ev.min_entropy)
True
"""

from gnll.simulation.distributions import (
    ExactValues,
    LeafPool,
    PrefixTreeDistribution,
    enumerate_log_probs,
    exact_values,
    make_leaf_pool,
    paper_alphas,
    sample_dirichlet_log_probs,
    sample_tree,
    sequence_log_prob,
)
from gnll.simulation.estimators import (
    beam_search,
    beam_search_estimates,
    importance_weights,
    max_estimates,
    predictive_entropy_estimates,
    sample_sequences,
)
from gnll.simulation.study import StudyConfig, run_study, summarize_claims, write_results
from gnll.simulation.theory import (
    entropy_sample_bound,
    max_likelihood_required_samples,
    max_likelihood_sample_bound,
)

__all__ = [
    "ExactValues",
    "LeafPool",
    "PrefixTreeDistribution",
    "StudyConfig",
    "beam_search",
    "beam_search_estimates",
    "entropy_sample_bound",
    "enumerate_log_probs",
    "exact_values",
    "importance_weights",
    "make_leaf_pool",
    "max_estimates",
    "max_likelihood_required_samples",
    "max_likelihood_sample_bound",
    "paper_alphas",
    "predictive_entropy_estimates",
    "run_study",
    "sample_dirichlet_log_probs",
    "sample_sequences",
    "sample_tree",
    "sequence_log_prob",
    "summarize_claims",
    "write_results",
]
