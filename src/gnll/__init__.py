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
    "Calibrator",
    "Generation",
    "GenerationConfig",
    "Model",
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
    raise AttributeError(f"module 'gnll' has no attribute {name!r}")
