"""gnll: uncertainty of LLM answers from the negative log-likelihood of the greedy answer (G-NLL).

>>> from gnll import measures
>>> round(measures.g_nll([-0.1, -0.2]), 6)
0.3
"""

from gnll import measures
from gnll.backends import Generation, GenerationConfig, Model, load_model

__version__ = "0.1.0"
__all__ = ["Generation", "GenerationConfig", "Model", "load_model", "measures", "__version__"]
