"""G-NLL inside the frameworks applications call models through: LangChain, LiteLLM, DSPy, LlamaIndex.

Each framework has its module, imported only when used (``import gnll`` imports none of them, nor
any framework), each an optional extra: ``pip install "gnll[langchain]"`` (``[litellm]``, ``[dspy]``,
``[llamaindex]``):

- :mod:`gnll.integrations.langchain`: :func:`~gnll.integrations.langchain.with_uncertainty` wraps a
  chat model (``ChatOpenAI``) so that every message carries ``response_metadata["uncertainty"]``;
  :class:`~gnll.integrations.langchain.UncertaintyCallbackHandler` only observes.
- :mod:`gnll.integrations.litellm`: a ``CustomLogger`` for the LiteLLM proxy (``config.yaml``) and
  the SDK (``litellm.callbacks``).
- :mod:`gnll.integrations.dspy`: :class:`~gnll.integrations.dspy.FieldConfidence`, a module whose
  ``Prediction`` carries the G-NLL of one output field's value.
- :mod:`gnll.integrations.llamaindex`: an instrumentation event handler and an LLM wrapper.

None computes G-NLL itself: the framework's per-token log-probs are read into an OpenAI choice and
scored by :class:`~gnll.integrations.core.AnswerScorer`, which goes through the same code as ``gnll
serve --upstream`` (:func:`gnll.serving.proxy.choice_answer`, :func:`gnll.policy.annotate`):
the same answer gets the same ``uncertainty`` object, spans, ``p_correct`` and decision.
"""
