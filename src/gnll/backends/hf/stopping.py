"""Stopping: which tokens end an answer, when a row has ended, and where the answer text ends.

One :class:`StopRules` per set of stop strings serves every decoding path: gnll's loop asks it per
step, transformers' ``generate`` through :class:`StopStringCriteria`, and both cut their output
with :meth:`StopRules.split`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria

from gnll._util import atomic_write, cache_dir
from gnll.backends.base import Generation, GenerationConfig


def stop_vocab_ids(tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> list[int]:
    """Ids of vocabulary entries whose decoded text contains any stop string (disk-cached).

    Finding them means decoding the whole vocabulary once (seconds for a 262k vocabulary), so the
    result is cached under :func:`gnll._util.cache_dir` per tokenizer and stop strings.
    """
    vocab = tokenizer.get_vocab()
    key = hashlib.sha256(
        json.dumps([type(tokenizer).__name__, sorted(vocab.items()), list(stop)]).encode()
    ).hexdigest()[:24]
    path = cache_dir() / "stop-ids" / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    strings = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids = [i for i, text in enumerate(strings) if any(st in text for st in stop)]
    atomic_write(path, json.dumps(ids))
    return ids


def _is_byte_token(name: str | None) -> bool:
    """A SentencePiece byte-fallback token (``<0xE2>``): its bytes join a run of such tokens."""
    return name is not None and len(name) == 6 and name.startswith("<0x") and name.endswith(">")


class StopRules:
    """The stopping rules of one set of stop strings, for one tokenizer.

    Parameters
    ----------
    tokenizer:
        Decodes token tails and answers.
    stop:
        The stop strings (``GenerationConfig.stop``).
    eos_ids:
        End-of-sequence token ids: they end an answer with ``finish_reason="eos"``.
    device:
        Where :attr:`ids` (the stop token ids as a tensor) lives.

    Attributes
    ----------
    token_ids:
        EOS ids plus every token whose text contains a stop string (e.g. any token with a newline).
        Treating those tokens as end-of-sequence makes every decoding strategy, beam search
        included, end a hypothesis where the answer ends.
    strings:
        Stop strings that can span several tokens ("Question:"): found by decoding a row's tail.
    window:
        How many trailing tokens to decode for them: a stop string of c characters spans at most c
        tokens, +1 for a partial leading token.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        stop: tuple[str, ...],
        eos_ids: Collection[int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.eos_ids = frozenset(eos_ids)
        self.token_ids = frozenset(self.eos_ids | set(stop_vocab_ids(tokenizer, self.stop)))
        self.ids = torch.tensor(sorted(self.token_ids), dtype=torch.long, device=device)
        self.strings = tuple(s for s in self.stop if len(s) > 1)
        self.window = max((len(s) for s in self.strings), default=0) + 1

    def ended_by_text(self, tails: Sequence[Sequence[int]]) -> list[bool]:
        """For each row's generated ids, whether a multi-token stop string appears in its tail."""
        if not self.strings or not len(tails):
            return [False] * len(tails)
        texts = self.tokenizer.batch_decode([t[-self.window :] for t in tails])
        return [any(s in t for s in self.strings) for t in texts]

    def prefix_lengths(self, ids: Sequence[int], text: str | None = None) -> list[int]:
        """``len(decode(ids[:j]))`` for ``j = 0 .. len(ids)``, in linear time.

        ``text`` is ``decode(ids)`` if the caller has it. Decoding every prefix costs time
        quadratic in the answer's length. Instead, prefixes are decoded from an *anchor*: the last
        token before ``j`` whose own text is complete (not empty, no U+FFFD, not a byte-fallback
        ``<0xNN>`` token). Byte-level decoding is back at a character boundary after such a token,
        and a byte-fallback run or a leading-space strip cannot reach across it, so with the anchor
        as context ``len(decode(ids[:j])) = len(decode(ids[:a + 1])) + len(decode(ids[a:j])) -
        len(decode([ids[a]]))``: the same lengths as decoding each prefix. Tokenizers that clean up
        spaces after decoding (a rule that reaches across tokens) decode each prefix, as does any
        row whose pieces do not add up to ``text``.
        """
        ids, tok = list(ids), self.tokenizer
        if not ids:
            return [0]
        if getattr(tok, "clean_up_tokenization_spaces", False):
            return self._decoded_prefix_lengths(ids)
        pieces = tok.batch_decode([[i] for i in ids])
        names = tok.convert_ids_to_tokens(ids)
        anchors, last = [], -1  # anchors[j - 1]: the anchor of prefix j (< j - 1; -1: none yet)
        for t, (piece, name) in enumerate(zip(pieces, names, strict=True)):
            anchors.append(last)
            if piece and "\ufffd" not in piece and not _is_byte_token(name):
                last = t
        decoded = tok.batch_decode([ids[max(a, 0) : j] for j, a in enumerate(anchors, start=1)])
        length = [0]
        for a, seg in zip(anchors, decoded, strict=True):
            length.append(len(seg) if a < 0 else length[a + 1] + len(seg) - len(pieces[a]))
        if length[-1] != len(tok.decode(ids) if text is None else text):
            # A decoder this reasoning does not cover.
            return self._decoded_prefix_lengths(ids)
        return length

    def _decoded_prefix_lengths(self, ids: list[int]) -> list[int]:
        """``len(decode(ids[:j]))`` by decoding every prefix (quadratic time)."""
        return [0] + [
            len(t) for t in self.tokenizer.batch_decode([ids[:j] for j in range(1, len(ids) + 1)])
        ]

    def split(
        self,
        ids: list[int],
        raw: np.ndarray | None,
        tempered: np.ndarray | None,
        config: GenerationConfig,
    ) -> Generation:
        """Split generated ids into answer and terminator, cutting at the first stop string or EOS.

        ``raw``/``tempered`` are the log-probs of ``ids`` (``None``: not known yet, e.g. beams that
        are scored afterwards).
        """
        # Everything after the first stop/EOS token is padding.
        end = next((t + 1 for t, i in enumerate(ids) if i in self.token_ids), len(ids))
        ids = ids[:end]
        eos_at = next((t for t, i in enumerate(ids) if i in self.eos_ids), None)
        body = ids[:eos_at] if eos_at is not None else ids
        text = self.tokenizer.decode(body)
        hits = [(text.find(s), s) for s in config.stop if s in text]
        if hits:
            cut, stop_seq = min(hits)
            finish = "stop"
            # Answer tokens: those whose text lies entirely before the stop string.
            length = self.prefix_lengths(body, text)
            k = 0
            while k < len(body) and length[k + 1] <= cut:
                k += 1
            term_end = k + 1
            while term_end < len(body) and length[term_end] < cut + len(stop_seq):
                term_end += 1
            term_end = min(term_end, len(body))
        elif eos_at is not None:
            cut, stop_seq, finish = len(text), None, "eos"
            k, term_end = eos_at, eos_at + 1
        else:
            cut, stop_seq, finish = len(text), None, "length"
            k, term_end = len(ids), len(ids)
        answer_ids, term_ids = ids[:k], ids[k:term_end]
        lp = [] if raw is None else raw[: len(ids)].tolist()
        token_lp, term_lp = lp[:k], lp[k:term_end]
        if config.include_terminator:
            token_lp = token_lp + term_lp
        sampling = None
        if config.strategy == "sample":
            # An empty answer is scored by its stop token (the empty-answer rule): under the
            # distribution it was drawn from too, so that no sample mixes temperatures.
            n = k if k or not term_ids else 1
            sampling = (tempered[:n] if tempered is not None else raw[:n]).tolist()
        return Generation(
            text=text[:cut].strip(),
            token_ids=answer_ids,
            tokens=self.tokenizer.batch_decode([[i] for i in answer_ids]) if answer_ids else [],
            token_logprobs=token_lp,
            finish_reason=finish,
            stop_sequence=stop_seq,
            terminator_token_ids=term_ids,
            terminator_logprobs=term_lp,
            sampling_logprobs=sampling,
        )


class StopStringCriteria(StoppingCriteria):
    """:meth:`StopRules.ended_by_text` as a transformers ``StoppingCriteria`` (per-row).

    transformers' own ``StopStringCriteria`` pre-computes a table over the whole vocabulary (about a
    minute for Gemma's 262k tokens); decoding the last few new tokens of each row is cheap instead.
    """

    def __init__(self, rules: StopRules, prompt_len: int) -> None:
        self.rules = rules
        self.prompt_len = prompt_len

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        new = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.rules.window) :]
        done = self.rules.ended_by_text(new.tolist())
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
