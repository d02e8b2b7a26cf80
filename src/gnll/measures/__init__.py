"""Uncertainty measures: pure functions of token log-probabilities, and their registry.

- :mod:`~gnll.measures.functions` -- the measures as pure functions (G-NLL, PE, SE, ...);
- :mod:`~gnll.measures.logprobs` -- :func:`check_logprobs`, what a valid token log-prob is (one rule
  for every layer);
- :mod:`~gnll.measures.trace` -- DeepConf's trace confidences for reasoning models (trace
  quality for voting, not the answer's uncertainty);
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

# Each module lists its public names once, in its own __all__; this package re-exports all of them.
from gnll.measures import functions, logprobs, registry, trace
from gnll.measures.functions import *  # noqa: F403
from gnll.measures.logprobs import *  # noqa: F403
from gnll.measures.registry import *  # noqa: F403
from gnll.measures.trace import *  # noqa: F403

__all__ = [*functions.__all__, *logprobs.__all__, *registry.__all__, *trace.__all__]
