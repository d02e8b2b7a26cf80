"""Teacher-forced scoring: ``log p(c_t | prompt, c_<t)`` of given continuations, batched like generation.

Rows are packed under the same position budget as generation (``max_batch_tokens``) and a bound
on the logits tensor (rows x scored positions x vocab), the prompts' shared prefix runs once, and
the log-probs come from ``logsumexp`` and a gather: no second rows x positions x vocab tensor.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnll.backends.hf.prefill import Prefiller

#: Bound on the float32 logits of one scoring batch, in elements (1 GiB): with Gemma's 262k vocabulary
#: this is 1,024 scored positions, with SmolLM2's 49k about 5,400.
MAX_LOGITS_ELEMENTS = 2**28


@dataclass
class TokenScores:
    """One continuation scored: its log-probs and the model's top-1 tokens along it.

    Attributes
    ----------
    logprobs:
        ``log p(c_t | prompt, c_<t)`` per continuation token (float64).
    top1:
        The argmax token at each continuation position and at the position after the last one
        (``len(logprobs) + 1`` ids): ``top1[t] == c_t`` says ``c_t`` is the greedy choice, and
        ``top1[-1]`` is what greedy decoding would emit next.
    """

    logprobs: np.ndarray
    top1: np.ndarray


def plan_batches(
    lengths: list[int],
    keeps: list[int],
    *,
    max_rows: int,
    max_tokens: int | None,
    vocab: int,
) -> list[list[int]]:
    """Cut rows (sorted longest first) into consecutive batches under the row and budget bounds.

    A batch of rows ``i..j`` holds ``rows x lengths[i]`` positions and ``rows x max(keeps) x vocab``
    logits. A row over a budget on its own still gets a batch of its own.

    >>> plan_batches([9, 8, 3], [2, 6, 2], max_rows=8, max_tokens=None, vocab=10)
    [[0, 1, 2]]
    >>> plan_batches([9, 8, 3], [2, 6, 2], max_rows=8, max_tokens=18, vocab=10)
    [[0, 1], [2]]
    """
    batches: list[list[int]] = []
    for i in range(len(lengths)):
        if batches:
            cur = batches[-1]
            rows = len(cur) + 1
            keep = max(keeps[j] for j in (*cur, i))
            fits = (max_tokens is None or rows * lengths[cur[0]] <= max_tokens) and (
                rows * keep * vocab <= MAX_LOGITS_ELEMENTS
            )
            if rows <= max_rows and fits:
                cur.append(i)
                continue
        batches.append([i])
    return batches


@torch.inference_mode()
def score_ids(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    conts: list[list[int]],
    *,
    engine: Prefiller | None,
    batch_size: int,
    max_batch_tokens: int | None,
) -> list[TokenScores]:
    """Score ``conts[i]`` after ``prompt_ids[i]`` for every i; empty continuations score empty.

    With an ``engine`` the rows use gnll's prefill (shared prefix once, length groups); without,
    plainly padded rows go through ``model`` (the reference path).
    """
    out = [TokenScores(np.zeros(0), np.zeros(0, dtype=np.int64)) for _ in conts]
    todo = [i for i in range(len(conts)) if conts[i]]
    if not todo:
        return out
    seqs = {i: list(prompt_ids[i]) + list(conts[i]) for i in todo}
    order = sorted(todo, key=lambda i: -len(seqs[i]))
    prefix = None
    if engine is not None:
        # Beams of one prompt and the prompts of a task share most of their tokens: run those
        # once. The prefix must end before each prompt's last token, whose logits score c_1.
        cap = min(len(prompt_ids[i]) for i in todo) - 1
        prefix = engine.shared_prefix([seqs[i] for i in todo], cap=cap)
    to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    batches = plan_batches(
        [len(seqs[i]) for i in order],
        [len(conts[i]) + 1 for i in order],
        max_rows=batch_size,
        max_tokens=max_batch_tokens,
        vocab=getattr(model.config, "vocab_size", None) or len(tokenizer),
    )
    for batch in batches:
        idx = [order[j] for j in batch]
        rows = [seqs[i] for i in idx]
        keep = max(len(conts[i]) for i in idx) + 1
        if engine is not None:
            use = prefix if engine.prefix_fits(prefix, rows, 0) else None
            logits = engine.prefill(rows, use, keep=keep).logits
        else:
            padded = tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(model.device)
            kwargs = {"logits_to_keep": keep} if to_keep else {}
            logits = model(**padded, **kwargs).logits[:, -keep:].float()
        # Rows are right-aligned: column keep-1-c predicts c_1 and the last column predicts what
        # would follow the continuation. Token ids are laid out the same way (0 where unused).
        targets = torch.zeros((len(idx), keep), dtype=torch.long)
        for row, i in enumerate(idx):
            c = len(conts[i])
            targets[row, keep - 1 - c : keep - 1] = torch.tensor(conts[i])
        targets = targets.to(logits.device)
        chosen = logits.gather(2, targets[:, :, None])[:, :, 0]
        lp = (chosen - torch.logsumexp(logits, dim=-1)).double().cpu().numpy()
        top1 = logits.argmax(dim=-1).cpu().numpy()
        for row, i in enumerate(idx):
            c = len(conts[i])
            out[i] = TokenScores(lp[row, keep - 1 - c : keep - 1], top1[row, keep - 1 - c :])
    return out
