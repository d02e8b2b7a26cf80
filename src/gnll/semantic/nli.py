"""NLI clusterer: bidirectional entailment with a transformers sequence-classification NLI model.

As in Kuhn et al. (2023) and Farquhar et al. (2024): both answers are prefixed by the question
(``f"{question} {answer}"``), the model classifies ``premise => hypothesis`` in both directions, and
the predicted label is the arg-max class. Which class index means what is read from the model's
``config.id2label`` (never hard-coded): ``microsoft/deberta-large-mnli`` has ``0=CONTRADICTION``,
``1=NEUTRAL``, ``2=ENTAILMENT``, but other checkpoints order them differently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gnll.semantic.base import CONTRADICTION, ENTAILMENT, NEUTRAL, PairwiseClusterer, as_bool

__all__ = [
    "DEFAULT_NLI_MODEL",
    "REFERENCE_NLI_MODEL",
    "NLIClusterer",
    "nli_label_map",
    "local_nli_model_available",
]

#: Default NLI model: the one Kuhn et al. (2023) used, smaller than the reference code's.
DEFAULT_NLI_MODEL = "microsoft/deberta-large-mnli"
#: The NLI model of Farquhar et al.'s code, whose setup the paper follows (the paper names none).
REFERENCE_NLI_MODEL = "microsoft/deberta-v2-xlarge-mnli"

NOT_ENTAILMENT = "not_entailment"


def _canonical_label(name: str) -> str | None:
    s = re.sub(r"[^a-z]", "", str(name).lower())
    if s.startswith(("not", "non")) and "entail" in s:
        return NOT_ENTAILMENT
    if s.startswith("entail"):
        return ENTAILMENT
    if s.startswith("neutral"):
        return NEUTRAL
    if s.startswith("contra"):
        return CONTRADICTION
    return None


def nli_label_map(id2label: Mapping[Any, str]) -> dict[int, str]:
    """Map class indices to ``entailment``/``neutral``/``contradiction`` (or ``not_entailment``).

    Accepts the spellings found on NLI checkpoints (``ENTAILMENT``, ``entailment``, ``Entailment``,
    ``contradiction``, ``not_entailment``, ...). Generic names such as ``LABEL_0`` carry no meaning
    and are rejected: pass ``id2label`` explicitly to :class:`NLIClusterer` for such a model.

    >>> nli_label_map({0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"})
    {0: 'contradiction', 1: 'neutral', 2: 'entailment'}
    """
    if not id2label:
        raise ValueError("the model has no id2label mapping; pass id2label=... explicitly")
    out: dict[int, str] = {}
    for idx, name in id2label.items():
        label = _canonical_label(name)
        if label is None:
            raise ValueError(
                f"cannot tell what NLI class {idx} ({name!r}) means; id2label={dict(id2label)!r}. "
                "Expected names like entailment/neutral/contradiction; pass id2label=... explicitly"
            )
        out[int(idx)] = label
    if ENTAILMENT not in out.values():
        raise ValueError(f"no entailment class in id2label={dict(id2label)!r}")
    if len(set(out.values())) != len(out):
        raise ValueError(f"id2label={dict(id2label)!r} names the same NLI class twice")
    return out


def local_nli_model_available(name: str = DEFAULT_NLI_MODEL) -> bool:
    """Whether ``name`` is a local model directory or is fully present in the local hub cache."""
    if Path(name).is_dir():
        return (Path(name) / "config.json").is_file()
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    config = try_to_load_from_cache(name, "config.json")
    if not isinstance(config, str):
        return False
    snapshot = Path(config).parent
    return any((snapshot / f).exists() for f in ("model.safetensors", "pytorch_model.bin"))


class NLIClusterer(PairwiseClusterer):
    """Semantic clustering by bidirectional entailment under an NLI classifier.

    Parameters
    ----------
    model:
        Hub name or local path of a sequence-classification NLI model (default
        :data:`DEFAULT_NLI_MODEL`), or an already loaded ``PreTrainedModel`` (then pass
        ``tokenizer``).
    relation:
        ``"strict"`` (default): ``a => b`` and ``b => a`` are both entailment. ``"loose"``: no
        contradiction either way and not both neutral (needs a 3-class model).
    tokenizer:
        Tokenizer for a preloaded ``model``.
    condition_on_question:
        Prefix both answers with the question (default, as in the reference code).
    id2label:
        Override the model's ``config.id2label`` (for checkpoints with generic ``LABEL_n`` names).
    batch_size:
        Pairs per forward pass. All pairs of one partition step -- across every question of a
        :meth:`cluster_many` call -- go through together, length-sorted to limit padding.
    device:
        Torch device (default CPU; computation in float32).
    max_length:
        Truncation length of a premise/hypothesis pair (default: the tokenizer's, at most 512).
    """

    name = "nli"

    def __init__(
        self,
        model: Any = None,
        relation: str = "strict",
        *,
        tokenizer: Any = None,
        condition_on_question: bool = True,
        id2label: Mapping[Any, str] | None = None,
        batch_size: int = 32,
        device: str = "cpu",
        max_length: int | None = None,
    ) -> None:
        super().__init__(relation)
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if model is None:
            model = DEFAULT_NLI_MODEL
        if isinstance(model, str | Path):
            self.model_name = str(model)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_name)
            model = AutoModelForSequenceClassification.from_pretrained(
                self.model_name, dtype=torch.float32
            )
        else:
            if tokenizer is None:
                raise ValueError("pass tokenizer=... together with a preloaded model")
            self.model_name = str(getattr(model.config, "name_or_path", "") or type(model).__name__)
            model = model.float()
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.condition_on_question = as_bool(condition_on_question)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        tok_max = int(getattr(tokenizer, "model_max_length", 512) or 512)
        self.max_length = int(max_length) if max_length else min(tok_max, 512)
        self.label_map = nli_label_map(id2label if id2label is not None else model.config.id2label)
        if len(self.label_map) != int(model.config.num_labels):
            raise ValueError(
                f"id2label has {len(self.label_map)} classes "
                f"but the model outputs {model.config.num_labels}"
            )
        if relation == "loose" and not {NEUTRAL, CONTRADICTION} <= set(self.label_map.values()):
            raise ValueError(
                "the 'loose' relation needs a 3-class NLI model "
                "(entailment/neutral/contradiction); "
                f"this one has {sorted(set(self.label_map.values()))}"
            )

    def _text(self, question: str, answer: str) -> str:
        return f"{question} {answer}" if self.condition_on_question else answer

    def _predict_directional(self, triples: list[tuple[str, str, str]]) -> list[str]:
        import torch

        premises = [self._text(q, a) for q, a, _ in triples]
        hypotheses = [self._text(q, b) for q, _, b in triples]
        order = sorted(range(len(triples)), key=lambda i: len(premises[i]) + len(hypotheses[i]))
        out: list[str] = [""] * len(triples)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                enc = self.tokenizer(
                    [premises[i] for i in idx],
                    [hypotheses[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(**enc).logits
                self.stats.model_calls += 1
                for i, k in zip(idx, logits.argmax(dim=-1).tolist(), strict=True):
                    label = self.label_map[int(k)]
                    # A 2-class model's "not entailment" is neither entailment nor a contradiction.
                    out[i] = NEUTRAL if label == NOT_ENTAILMENT else label
        return out

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "model": self.model_name,
            "condition_on_question": self.condition_on_question,
            "id2label": {str(k): v for k, v in sorted(self.label_map.items())},
        }
