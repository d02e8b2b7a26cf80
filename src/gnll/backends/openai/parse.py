"""Read per-token log-probs out of the three response shapes servers use, and split off the terminator.

Shapes (``choices[i]``):

* **legacy completions** (vLLM, llama-cpp-python, OpenAI's old models): ``text`` and
  ``logprobs = {tokens, token_logprobs, top_logprobs, text_offset}``; vLLM adds ``token_ids`` and
  ``stop_reason`` (the matched stop string, a stop-token id, or ``None`` at EOS).
* **content on completions** (llama.cpp's ``llama-server``): ``text`` and
  ``logprobs = {content: [{id, token, bytes, logprob, top_logprobs}]}``.
* **chat** (every ``/v1/chat/completions``): ``message.content`` and ``logprobs.content[...]``.

This module is the one reader of the two log-prob shapes (``logprobs.content[]`` and the legacy
``tokens``/``token_logprobs``/``top_logprobs`` lists): :func:`logprob_shape`, :func:`logprob_pairs`,
:func:`logprob_entries`,
:func:`logprobs_from`, :func:`join_logprobs` and :func:`read_choice` serve the proxy, the reasoning
split, the stream reassembly and the framework integrations.

Servers cut the *text* at a stop string but keep the token that produced it (and vLLM keeps EOS), so
the answer's tokens are those lying entirely inside the returned text; the rest is the terminator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.openai.client import ServerError
from gnll.backends.reasoning import Label, ReasoningError, ReasoningFormat, ReasoningSplit
from gnll.measures.logprobs import LogprobError
from gnll.measures.logprobs import check_logprobs as _check_logprobs


@dataclass
class RawTokens:
    """Everything one choice says about its tokens, before the answer/terminator split."""

    text: str
    tokens: list[str]
    token_ids: list[int] | None
    logprobs: list[float | None]
    token_bytes: list[int] | None  # byte length of each token, when the server reports bytes
    top1: list[tuple[str, float] | None]
    tops: list[dict[str, float]]  # the reported alternatives per position (token -> log-prob)
    finish_reason: str | None
    stop_reason: Any
    has_stop_reason: bool
    #: A reasoning model's trace/marker/answer split; the fields above are then the answer's.
    reasoning: ReasoningSplit | None = None


def logprob_pairs(logprobs: Any) -> list[tuple[str, Any]]:
    """``(token, log-prob)`` of a choice's (or a stream chunk's) ``logprobs``, in the chat shape
    (``content[]``) or the legacy completions shape (``tokens`` / ``token_logprobs``); none when
    there are no log-probs.

    Examples
    --------
    >>> logprob_pairs({"content": [{"token": " Paris", "logprob": -0.1}]})
    [(' Paris', -0.1)]
    >>> logprob_pairs({"tokens": [" Paris"], "token_logprobs": [-0.1]}), logprob_pairs(None)
    ([(' Paris', -0.1)], [])
    """
    if not isinstance(logprobs, dict):
        return []
    if isinstance(logprobs.get("content"), list):
        return [(e.get("token", ""), e.get("logprob")) for e in logprobs["content"]]
    tokens, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    return list(zip(tokens, values, strict=False))


def logprob_shape(logprobs: Any) -> str | None:
    """Which shape a choice's ``logprobs`` has: ``"content"`` (``content[]``), ``"legacy"``
    (``tokens`` / ``token_logprobs``), or ``None`` (neither: no log-probs).

    >>> logprob_shape({"content": []}), logprob_shape({"tokens": []}), logprob_shape(None)
    ('content', 'legacy', None)
    """
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        return "content"
    return "legacy" if isinstance(logprobs.get("tokens"), list) else None


def logprob_entries(logprobs: Any) -> list[Any]:
    """The per-token entries of a choice's (or a stream chunk's) ``logprobs`` in the chat shape:
    ``content[]`` as it came (``{token, logprob, top_logprobs[, bytes, id]}``), or the legacy
    completions shape's parallel lists as such entries (each ``top_logprobs`` dict as a list of
    ``{token, logprob}``); none when there are no log-probs.

    Examples
    --------
    >>> logprob_entries({"tokens": [" Paris"], "token_logprobs": [-0.1],
    ...                  "top_logprobs": [{" Paris": -0.1, " Lyon": -2.5}]})
    [{'token': ' Paris', 'logprob': -0.1, 'top_logprobs': [{'token': ' Paris', 'logprob': -0.1}, {'token': ' Lyon', 'logprob': -2.5}]}]
    >>> logprob_entries({"content": [{"token": "4", "logprob": -0.3}]}), logprob_entries(None)
    ([{'token': '4', 'logprob': -0.3}], [])
    """
    if not isinstance(logprobs, dict):
        return []
    if isinstance(logprobs.get("content"), list):
        return list(logprobs["content"])
    tokens = logprobs.get("tokens")
    if not isinstance(tokens, list):
        return []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    return [
        {
            "token": token,
            "logprob": value,
            "top_logprobs": [{"token": k, "logprob": v} for k, v in top.items()]
            if isinstance(top, dict)
            else [],
        }
        for token, value, top in zip(tokens, values, [*tops, *[None] * len(tokens)], strict=False)
    ]


def logprobs_from(logprobs: dict[str, Any], start: int) -> dict[str, Any]:
    """``logprobs`` (either shape) from token ``start`` on; the legacy shape's ``text_offset``
    (offsets into the whole text) is dropped.

    >>> logprobs_from({"tokens": ["a", "b"], "token_logprobs": [-1, -2], "text_offset": [0, 1]}, 1)
    {'tokens': ['b'], 'token_logprobs': [-2]}
    """
    lp = dict(logprobs)
    if isinstance(lp.get("content"), list):
        lp["content"] = lp["content"][start:]
    else:
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            if isinstance(lp.get(key), list):
                lp[key] = lp[key][start:]
        lp.pop("text_offset", None)
    return lp


def join_logprobs(parts: list[Any]) -> dict[str, Any]:
    """The ``logprobs`` of a whole choice from its stream chunks' ones, in the shape they came in:
    ``content[]`` when any chunk carried entries, else the legacy lists (empty when no chunk
    carried log-probs).

    >>> join_logprobs([{"tokens": [" Par"], "token_logprobs": [-0.1]},
    ...                {"tokens": ["is"], "token_logprobs": [-0.2]}])
    {'tokens': [' Par', 'is'], 'token_logprobs': [-0.1, -0.2], 'top_logprobs': [None, None]}
    """
    content: list[Any] = []
    tokens: list[Any] = []
    values: list[Any] = []
    tops: list[Any] = []
    for lp in parts:
        if not isinstance(lp, dict):
            continue
        if isinstance(lp.get("content"), list):
            content.extend(lp["content"])
        elif isinstance(lp.get("tokens"), list):
            tokens.extend(lp["tokens"])
            values.extend(lp.get("token_logprobs") or [])
            tops.extend(lp.get("top_logprobs") or [None] * len(lp["tokens"]))
    if content:
        return {"content": content}
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}


def read_choice(
    choice: dict[str, Any],
    *,
    reasoning: ReasoningFormat | str | None = None,
    marker_ids: list[int] | None = None,
    labels: list[Label | None] | None = None,
) -> RawTokens:
    """Normalise one ``choices[i]`` entry of any of the three shapes.

    A reasoning model's choice (``message.reasoning`` / ``reasoning_content``, or any choice when
    ``reasoning`` names the model's format) is split first (:func:`gnll.backends.openai.reasoning.split_choice`):
    the tokens read are the answer's, the split rides along in :attr:`RawTokens.reasoning`. A
    reasoning response whose log-probs cannot be aligned with its answer is a :class:`ServerError`.

    Examples
    --------
    >>> raw = read_choice({"text": " Paris", "finish_reason": "stop", "stop_reason": "\\n",
    ...     "token_ids": [12, 7], "logprobs": {"tokens": [" Paris", "\\n"],
    ...     "token_logprobs": [-0.5, -0.1], "top_logprobs": [{" Paris": -0.5}, {"\\n": -0.1}]}})
    >>> raw.tokens, raw.token_ids, raw.top1[0]
    ([' Paris', '\\n'], [12, 7], (' Paris', -0.5))
    """
    # The reasoning split reads the shapes with this module's readers, so it is imported here.
    from gnll.backends.openai.reasoning import split_choice

    if not isinstance(choice, dict):
        raise ServerError(f"a choice must be a JSON object, got {type(choice).__name__}")
    try:
        choice, split = split_choice(choice, reasoning, marker_ids=marker_ids, labels=labels)
    except ReasoningError as exc:
        raise ServerError(str(exc)) from None
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise ServerError(
            "the response carries no log-probs (`logprobs` is missing): the server must support "
            "`logprobs` on this endpoint (run `gnll doctor` against it)"
        )
    token_ids = choice.get("token_ids")
    if isinstance(lp.get("content"), list):
        entries = lp["content"]
        tokens = [str(e.get("token", "")) for e in entries]
        values = [e.get("logprob") for e in entries]
        ids = [e.get("id") for e in entries]
        if token_ids is None and ids and all(isinstance(i, int) for i in ids):
            token_ids = ids
        byte_lists = [e.get("bytes") for e in entries]
        token_bytes = (
            [len(b) for b in byte_lists]
            if byte_lists and all(isinstance(b, list) for b in byte_lists)
            else None
        )
        top1 = [_top1_content(e.get("top_logprobs")) for e in entries]
        tops = [
            {
                str(a.get("token", "")): a["logprob"]
                for a in (e.get("top_logprobs") or [])
                if isinstance(a, dict) and a.get("logprob") is not None
            }
            for e in entries
        ]
    elif isinstance(lp.get("tokens"), list):
        tokens = [str(t) for t in lp["tokens"]]
        values = list(lp.get("token_logprobs") or [])
        token_bytes = None
        tops = lp.get("top_logprobs") or [None] * len(tokens)
        top1 = [_top1_legacy(t) for t in tops]
        tops = [
            {str(k): v for k, v in t.items() if v is not None} if isinstance(t, dict) else {}
            for t in tops
        ]
        if token_ids is None and tokens and all(t.startswith("token_id:") for t in tokens):
            token_ids = [int(t.split(":", 1)[1]) for t in tokens]
    else:
        raise ServerError(
            "unrecognised `logprobs` shape: expected `tokens`/`token_logprobs` or `content[]`"
        )
    if len(values) != len(tokens):
        raise ServerError(f"{len(tokens)} tokens but {len(values)} log-probs in the response")
    if token_ids is not None and len(token_ids) != len(tokens):
        token_ids = None  # e.g. prompt ids mixed in; the strings still tell the split
    return RawTokens(
        text="" if text is None else str(text),
        tokens=tokens,
        token_ids=[int(i) for i in token_ids] if token_ids is not None else None,
        logprobs=values,
        token_bytes=token_bytes,
        top1=top1 + [None] * (len(tokens) - len(top1)),
        tops=tops + [{}] * (len(tokens) - len(tops)),
        finish_reason=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        has_stop_reason="stop_reason" in choice,
        reasoning=split,
    )


def _top1_legacy(top: Any) -> tuple[str, float] | None:
    if not isinstance(top, dict) or not top:
        return None
    token, value = max(top.items(), key=lambda kv: -math.inf if kv[1] is None else kv[1])
    return (str(token), float(value)) if value is not None else None


def _top1_content(top: Any) -> tuple[str, float] | None:
    if not isinstance(top, list) or not top:
        return None
    best = max(top, key=lambda e: -math.inf if e.get("logprob") is None else e["logprob"])
    return (
        (str(best.get("token", "")), float(best["logprob"]))
        if best.get("logprob") is not None
        else None
    )


def server_logprobs(values: list[float | None], tokens: list[str], where: str) -> list[float]:
    """:func:`gnll.measures.check_logprobs` for a server's reply: a :class:`ServerError`, with the server's remedy.

    Examples
    --------
    >>> server_logprobs([-0.5, 1e-7], ["a", "b"], "prompt 3")
    [-0.5, 0.0]
    >>> server_logprobs([-9999.0], ["x"], "prompt 3")
    Traceback (most recent call last):
    ...
    gnll.backends.openai.client.ServerError: prompt 3: token 0 'x' has log-prob -9999.0, at or below -9999, the stand-in servers send for -inf (probability 0): the token could not have been generated from the raw distribution; check the server's logprobs mode and sampling settings
    """
    try:
        return _check_logprobs(values, where=where, tokens=tokens).tolist()
    except LogprobError as exc:
        remedy = "; check the server's logprobs mode and sampling settings"
        raise ServerError(f"{exc}{remedy if exc.kind == 'sentinel' else ''}") from None


def _char_lengths(tokens: list[str], text: str) -> list[int]:
    """How many characters of ``text`` each token covers.

    A character split over several tokens (a multi-byte UTF-8 character) comes back from
    llama-cpp-python as empty token strings, so counting the strings would lose it, and the stop
    token after it would seem to lie inside the text. The characters a run of such fragments covers
    are the gap between the tokens around it; they are given to the run's last fragment.

    >>> _char_lengths(["S", " and", " ", "", "", "\\n"], "S and \\x85")
    [1, 4, 1, 0, 1, 1]
    >>> _char_lengths([" Paris", ".\\n"], " Paris.")
    [6, 2]
    """
    out = [len(t) for t in tokens]
    pos, pending = 0, []
    for i, tok in enumerate(tokens):
        if tok == "":
            pending.append(i)
            continue
        if pending:
            j = text.find(tok, pos)
            end = j if j >= pos else len(text)  # not found: the fragments end the text
            out[pending[-1]] = end - pos
            pos, pending = end, []
        pos += len(tok)
    if pending:
        out[pending[-1]] = max(0, len(text) - pos)
    return out


def to_generation(
    raw: RawTokens, config: GenerationConfig, *, eos_logprob: bool, where: str
) -> Generation:
    """Split a choice into answer and terminator tokens the way the hf backend does.

    Answer tokens lie entirely inside the returned text (which the server already cut at the stop
    string); the token(s) covering the stop string, or the final EOS token, are the terminator.

    Examples
    --------
    >>> raw = read_choice({"text": " Paris", "finish_reason": "stop", "stop_reason": "\\n",
    ...     "token_ids": [12, 7], "logprobs": {"tokens": [" Paris", "\\n"],
    ...     "token_logprobs": [-0.5, -0.1]}})
    >>> g = to_generation(raw, GenerationConfig.greedy(), eos_logprob=True, where="prompt 0")
    >>> g.text, g.tokens, g.token_logprobs, g.terminator_logprobs, g.finish_reason
    ('Paris', [' Paris'], [-0.5], [-0.1], 'stop')
    """
    n = len(raw.tokens)
    if raw.token_bytes is not None:
        lengths, cut = raw.token_bytes, len(raw.text.encode("utf-8"))
    else:
        lengths, cut = _char_lengths(raw.tokens, raw.text), len(raw.text)
    ends: list[int] = []
    pos = 0
    for length in lengths:
        pos += length
        ends.append(pos)
    k = 0
    while k < n and ends[k] <= cut:
        k += 1
    full = "".join(raw.tokens)
    stop_seq: str | None = None
    if raw.finish_reason == "length" and k == n:
        finish = "length"
    elif isinstance(raw.stop_reason, str):
        finish, stop_seq = "stop", raw.stop_reason
    elif raw.has_stop_reason:
        finish = "eos"  # vLLM: None (EOS) or an int stop-token id
    else:
        # No stop_reason field (llama.cpp): the stop string shows in the tokens past the text.
        if raw.token_bytes is None:  # from the reconstructed offsets (byte fragments included)
            start = ends[k - 1] if k else 0
            tail = "".join(raw.tokens[k:])[max(0, cut - start) :]
        else:
            tail = full[len(raw.text) :] if full.startswith(raw.text) else ""
        stop_seq = next((s for s in config.stop if tail.startswith(s)), None)
        finish = "stop" if stop_seq is not None else "eos"
        if stop_seq is None and raw.finish_reason == "length":
            finish = "length"
    if finish == "eos" and eos_logprob and n and k == n and (n == 1 or ends[n - 2] >= cut):
        k = n - 1  # the EOS token adds no text, so it sits at the very end
    if finish == "stop":
        need = cut + (
            len(stop_seq.encode()) if raw.token_bytes is not None else len(stop_seq or "")
        )
        t = k
        while t < n and (t == k or ends[t - 1] < need):
            t += 1
        term = slice(k, t)
    elif finish == "eos":
        term = slice(k, min(n, k + 1))
    else:
        term = slice(k, k)
    values = server_logprobs(raw.logprobs[: term.stop], raw.tokens[: term.stop], where)
    ids = raw.token_ids if raw.token_ids is not None else [-1] * n
    answer_lp, term_lp = values[:k], values[term]
    if k == 0 and not term_lp:
        # gnll scores an empty answer by its stop token's log-prob; without it there is no G-NLL,
        # and 0 ("certain") would be a lie.
        raise ServerError(
            f"{where}: the answer is empty and the server reported no log-prob for the token that "
            f"ended it ({finish}), so it has no G-NLL (an empty answer is scored by its stop "
            "token's log-prob); vLLM reports it"
        )
    return Generation(
        text=raw.text.strip(),
        token_ids=ids[:k],
        tokens=raw.tokens[:k],
        token_logprobs=answer_lp + (term_lp if config.include_terminator else []),
        finish_reason=finish,
        stop_sequence=stop_seq,
        terminator_token_ids=ids[term],
        terminator_logprobs=term_lp,
        sampling_logprobs=None,
        reasoning=raw.reasoning,
    )
