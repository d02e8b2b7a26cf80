"""Uncertainty measures: pure functions of token log-probabilities, and their registry.

- :mod:`~gnll.measures.functions` -- the measures as pure functions (G-NLL, PE, SE, ...);
- :mod:`~gnll.measures.logprobs` -- :func:`check_logprobs`, what a valid token log-prob is (one rule
  for every layer);
- :mod:`~gnll.measures.registry` -- :class:`Measure` specs, the paper's column :data:`ORDER`, and
  the one :func:`compute` that ``gnll ask``, ``gnll eval``, scoring and serving share.

Every name of these modules is available here, so ``from gnll import measures`` is all a caller needs.

Example
-------
>>> from gnll import measures
>>> round(measures.g_nll([-0.1, -0.5, -0.02]), 4)
0.62
>>> measures.compute(["g-nll", "ln-g-nll"], greedy=[-0.5, -0.25])
{'g-nll': 0.75, 'ln-g-nll': 0.375}
"""

from gnll.measures.functions import (
    TokenLogprobs,
    cluster_log_probs,
    discrete_semantic_entropy,
    g_nll,
    ln_g_nll,
    ln_predictive_entropy,
    ln_semantic_entropy,
    ln_semantic_entropy_plugin,
    max_cluster_probability,
    msp_estimate,
    predictive_entropy,
    semantic_entropy,
    semantic_entropy_plugin,
    sequence_logprob,
)
from gnll.measures.logprobs import (
    LOGPROB_TOLERANCE,
    SENTINEL_LOGPROB,
    LogprobError,
    check_logprobs,
)
from gnll.measures.registry import (
    MEASURES,
    ORDER,
    PAPER_BASELINES,
    Evidence,
    Measure,
    Needs,
    computable,
    compute,
    get,
    required_capabilities,
    requirements,
    unsupported,
    validate,
)

__all__ = [
    "g_nll",
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
    "LOGPROB_TOLERANCE",
    "SENTINEL_LOGPROB",
    "LogprobError",
    "check_logprobs",
    "Evidence",
    "MEASURES",
    "Measure",
    "Needs",
    "ORDER",
    "PAPER_BASELINES",
    "computable",
    "compute",
    "get",
    "required_capabilities",
    "requirements",
    "unsupported",
    "validate",
]
