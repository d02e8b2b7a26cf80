"""gnll: uncertainty of LLM answers from the negative log-likelihood of the greedy answer (G-NLL).

>>> from gnll import measures
>>> round(measures.g_nll([-0.1, -0.2]), 6)
0.3
"""

from gnll import measures
from gnll.backends import Generation, GenerationConfig, Model, load_model
from gnll.scoring.api import score

__version__ = "0.1.0"
__all__ = [
    "AskResult",
    "Calibrator",
    "Decision",
    "Evaluation",
    "Generation",
    "GenerationConfig",
    "Model",
    "ask",
    "decide",
    "evaluate",
    "load_model",
    "measures",
    "score",
    "__version__",
]


def __getattr__(name: str):
    # Calibrator pulls in scipy.stats; import it on first use, not with every `import gnll`.
    if name == "Calibrator":
        from gnll.calibration import Calibrator

        return Calibrator
    # The one-call entry points pull in the evaluation prompts and runner: also on first use.
    if name in ("ask", "AskResult"):
        from gnll.scoring import asking

        return getattr(asking, name)
    if name in ("decide", "Decision"):
        from gnll.scoring import decisions

        return getattr(decisions, name)
    if name in ("evaluate", "Evaluation"):
        from gnll.evaluation.run import simple

        return getattr(simple, name)
    raise AttributeError(f"module 'gnll' has no attribute {name!r}")
