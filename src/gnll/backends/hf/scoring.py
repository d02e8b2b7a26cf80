"""Teacher-forced scoring: ``log p(c_t | prompt, c_<t)`` of given continuations, batched like generation.

Rows are packed under the same position budget as generation (``max_batch_tokens``) and a bound
on the logits tensor (rows x scored positions x vocab) that follows it: no more float32 logits than
the KV cache of ``max_batch_tokens`` positions holds (:func:`max_logits_elements`), so lowering
``max_batch_tokens`` lowers scoring's memory too. A continuation too long for that bound on its own
is scored in pieces. The prompts' shared prefix runs once, the log-probs come from
``logsumexp`` and a gather (no second rows x positions x vocab tensor), and a batch that runs out
of memory is retried in halves.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnll._util import progress as show_progress_bar
from gnll.backends.base import ScoredAnswer
from gnll.backends.hf.planning import halving_on_oom
from gnll.backends.hf.prefill import Prefiller, left_padded, pad_token_id
from gnll.backends.hf.stopping import StopRules

#: Bound on the float32 logits of one scoring batch, in elements (1 GiB), when ``max_batch_tokens``
#: is ``None`` (no position budget): with Gemma's 262k vocabulary 1,024 scored positions.
MAX_LOGITS_ELEMENTS = 2**28


def kv_elements_per_position(config: Any) -> int | None:
    """Floats the KV cache holds per position (keys and values of every layer), if the config says.

    >>> from types import SimpleNamespace as C
    >>> kv_elements_per_position(C(num_hidden_layers=30, num_attention_heads=9,
    ...     num_key_value_heads=3, hidden_size=576))  # SmolLM2-135M: 2 x 30 x 3 x 64
    11520
    >>> kv_elements_per_position(C()) is None
    True
    """
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * int(layers) * int(kv_heads) * int(head_dim)


def max_logits_elements(config: Any, max_batch_tokens: int | None) -> int:
    """The logits bound of one scoring batch: the KV cache of ``max_batch_tokens`` positions.

    Scoring then needs no more memory for its logits than generation needs for its cache under the
    same ``max_batch_tokens`` (SmolLM2-135M at the default 20,480: 236M floats, 0.9 GiB). Without a
    position budget, or for a config that does not describe its cache, :data:`MAX_LOGITS_ELEMENTS`.

    >>> from types import SimpleNamespace as C
    >>> smol = C(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    >>> max_logits_elements(smol, 20480), max_logits_elements(smol, 64)
    (235929600, 737280)
    >>> max_logits_elements(smol, None) == MAX_LOGITS_ELEMENTS
    True
    """
    per_position = kv_elements_per_position(config)
    if max_batch_tokens is None or per_position is None:
        return MAX_LOGITS_ELEMENTS
    return int(max_batch_tokens) * per_position


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
        ``top1[-1]`` is what greedy decoding would emit next. Empty unless asked for.
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
    max_logits: int = MAX_LOGITS_ELEMENTS,
) -> list[list[int]]:
    """Cut rows (sorted longest first) into consecutive batches under the row and budget bounds.

    A batch of rows ``i..j`` holds ``rows x lengths[i]`` positions and ``rows x max(keeps) x vocab``
    logits (at most ``max_logits``). A row over a budget on its own still gets a batch of its own.

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
                rows * keep * vocab <= max_logits
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
    top1: bool = False,
    progress: bool = False,
) -> list[TokenScores]:
    """Score ``conts[i]`` after ``prompt_ids[i]`` for every i; empty continuations score empty.

    With an ``engine`` the rows use gnll's prefill (shared prefix once, length groups); without,
    plainly padded rows go through ``model`` (the reference path). ``top1=False`` skips the
    argmax (and the rows of empty continuations); ``progress`` shows a bar over batches.
    """
    out = [TokenScores(np.zeros(0), np.zeros(0, dtype=np.int64)) for _ in conts]
    # An empty continuation is still run when its top-1 next token is wanted (``top1``).
    todo = [i for i in range(len(conts)) if conts[i] or top1]
    if not todo:
        return out
    vocab = getattr(model.config, "vocab_size", None) or len(tokenizer)
    max_logits = max_logits_elements(model.config, max_batch_tokens)
    longest = max(1, max_logits // vocab - 1)
    if any(len(conts[i]) > longest for i in todo):
        return _score_in_pieces(
            model,
            tokenizer,
            prompt_ids,
            conts,
            longest,
            engine=engine,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
            top1=top1,
            progress=progress,
        )
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
        vocab=vocab,
        max_logits=max_logits,
    )

    def run(idx: list[int]) -> list[TokenScores]:
        rows = [seqs[i] for i in idx]
        keep = max(len(conts[i]) for i in idx) + 1
        if engine is not None:
            use = prefix if engine.prefix_fits(prefix, rows, 0) else None
            logits = engine.prefill(rows, use, keep=keep).logits
        else:
            ids, mask = left_padded(rows, pad_token_id(tokenizer), model.device)
            kwargs = {"logits_to_keep": keep} if to_keep else {}
            logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits[:, -keep:].float()
        # Rows are right-aligned: column keep-1-c predicts c_1 and the last column predicts what
        # would follow the continuation. Token ids are laid out the same way (0 where unused).
        targets = torch.zeros((len(idx), keep), dtype=torch.long)
        for row, i in enumerate(idx):
            c = len(conts[i])
            targets[row, keep - 1 - c : keep - 1] = torch.tensor(conts[i])
        targets = targets.to(logits.device)
        chosen = logits.gather(2, targets[:, :, None])[:, :, 0]
        lp = (chosen - torch.logsumexp(logits, dim=-1)).double().cpu().numpy()
        best = logits.argmax(dim=-1).cpu().numpy() if top1 else None
        scores = []
        for row, i in enumerate(idx):
            c = len(conts[i])
            scores.append(
                TokenScores(
                    lp[row, keep - 1 - c : keep - 1],
                    best[row, keep - 1 - c :] if best is not None else np.zeros(0, dtype=np.int64),
                )
            )
        return scores

    for batch in show_progress_bar(batches, progress, "scoring", unit="batch"):
        idx = [order[j] for j in batch]
        # An out-of-memory batch is retried in halves before the error reaches the user.
        for i, scores in zip(idx, halving_on_oom(run, idx), strict=True):
            out[i] = scores
    return out


def _score_in_pieces(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    conts: list[list[int]],
    longest: int,
    **options: Any,
) -> list[TokenScores]:
    """Score continuations longer than ``longest`` tokens piece by piece.

    Each piece is scored after the prompt and the pieces before it, so no batch ever holds more
    than ``longest + 1`` positions of full-vocabulary logits per row (at the cost of running the
    earlier tokens again for each piece).
    """
    pieces: list[int] = []  # the row of each piece, in order
    seg_prompts, seg_conts = [], []
    for i, cont in enumerate(conts):
        for start in range(0, max(len(cont), 1), longest):
            pieces.append(i)
            seg_prompts.append(list(prompt_ids[i]) + list(cont[:start]))
            seg_conts.append(list(cont[start : start + longest]))
    scored = score_ids(model, tokenizer, seg_prompts, seg_conts, **options)
    out = []
    for i in range(len(conts)):
        parts = [s for row, s in zip(pieces, scored, strict=True) if row == i]
        # top1 of a piece ends with the argmax after it, which the next piece repeats first.
        best = [p.top1[:-1] for p in parts[:-1]] + [parts[-1].top1]
        if not len(parts[-1].top1):
            best = [parts[-1].top1]  # top1 not asked for
        out.append(TokenScores(np.concatenate([p.logprobs for p in parts]), np.concatenate(best)))
    return out


def tokenize_answers(
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    answers: list[str],
    *,
    add_special_tokens: bool,
) -> tuple[list[list[int]], list[list[int]], list[bool]]:
    """Prompt ids, answer ids and boundary flags from one joint tokenisation of prompt + answer.

    The prompt ids are the prompt's own tokenisation (what generation conditions on). When the joint
    tokens start with them, the answer ids are the rest of the joint tokens. Otherwise the tokenizer
    merged text across the boundary (a prompt ending in a space before a word, say); the answer is
    then tokenised on its own and appended to the prompt's ids, as a generation from that prompt
    would be laid out, and the row is flagged.

    The answer is scored verbatim: after a few-shot prompt ending in ``"Answer:"`` a model's answer
    is ``" Paris"`` (with its space), which is what :meth:`HFModel.generate` decodes before it
    strips the text.
    """
    prompt_ids = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    joint = tokenizer(
        [t + a for t, a in zip(texts, answers, strict=True)], add_special_tokens=add_special_tokens
    )["input_ids"]
    answer_ids, merged = [], []
    for p, j, a in zip(prompt_ids, joint, answers, strict=True):
        if list(j[: len(p)]) == list(p):
            answer_ids.append(list(j[len(p) :]))
            merged.append(False)
        else:
            answer_ids.append(list(tokenizer(a, add_special_tokens=False)["input_ids"]))
            merged.append(True)
    return [list(p) for p in prompt_ids], answer_ids, merged


def answer_end_ids(tokenizer: PreTrainedTokenizerBase, stops: StopRules) -> frozenset[int]:
    """Tokens whose greedy choice ends an answer: the stop tokens (EOS, any token containing a stop
    string) and the first token of each stop string, with or without a leading space."""
    ids = set(stops.token_ids)
    for s in stops.stop:
        for text in (s, " " + s):
            first = tokenizer(text, add_special_tokens=False)["input_ids"][:1]
            if first and tokenizer.decode(first).strip():
                ids.add(first[0])
    return frozenset(ids)


def score_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    answers: list[str],
    *,
    add_special_tokens: bool,
    end_ids: frozenset[int],
    engine: Prefiller | None,
    batch_size: int,
    max_batch_tokens: int | None,
    progress: bool = False,
) -> list[ScoredAnswer]:
    """Score each answer (text) after its rendered prompt ``texts[i]``: what ``HFModel.score`` returns.

    ``end_ids`` are the tokens that end an answer (:func:`answer_end_ids`): ``greedy_stops`` is
    whether the top-1 token after the answer is one of them.
    """
    prompt_ids, answer_ids, merged = tokenize_answers(
        tokenizer, texts, answers, add_special_tokens=add_special_tokens
    )
    limit = getattr(model.config, "max_position_embeddings", None)
    for i, (p, a) in enumerate(zip(prompt_ids, answer_ids, strict=True)):
        if not p:
            raise ValueError(f"prompt {i} has no tokens: the answer has nothing to follow")
        if limit and len(p) + len(a) > limit:
            raise ValueError(
                f"prompt {i} + answer are {len(p) + len(a)} tokens, over the model's "
                f"{limit}-token context"
            )
    scored = score_ids(
        model,
        tokenizer,
        prompt_ids,
        answer_ids,
        engine=engine,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        top1=True,
        progress=progress,
    )
    return [
        ScoredAnswer(
            text=a,
            token_ids=ids,
            tokens=[tokenizer.decode([t]) for t in ids],
            token_logprobs=s.logprobs.tolist(),
            is_greedy=bool(np.array_equal(s.top1[:-1], ids)),
            greedy_stops=int(s.top1[-1]) in end_ids,
            boundary_merged=m,
        )
        for a, ids, s, m in zip(answers, answer_ids, scored, merged, strict=True)
    ]
