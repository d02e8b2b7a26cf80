"""Where in an answer the doubt sits: the NLL of each sentence, or of each JSON field value.

G-NLL is a sum over the answer's tokens, so it splits exactly into parts: the NLL of a span is the sum
over the tokens assigned to it, and the spans plus the unassigned tokens (white space between
sentences; JSON keys, quotes and punctuation) partition the answer's tokens. Their NLLs therefore add
up to the whole answer's G-NLL (:attr:`SpanReport.total_nll`). Nothing here needs a model: only the
answer's text, its tokens as strings and their log-probs.

Tokens are placed in the text by character alignment (the tokens' concatenation may differ from the
text: a stripped leading space, a cut stop sequence, a byte-level token decoded as ``"\\ufffd"``).

**The straddling rule.** A token goes to the span that holds the most of its non-white-space
characters (all its characters, if it is only white space); a tie goes to the earlier span; a token
with none of those characters inside any span is unassigned. A token is never split. A token that
also has non-white-space characters outside the span it went to (``". The"`` across two sentences,
``'"Paris'`` across a JSON string's quote) is counted in that span's ``straddling``: its whole
log-prob is in the span, so the span's edge is only as sharp as the tokeniser's.

>>> r = span_nlls(["Paris", " is", " big", ".", " Rome", "?"], [-0.1, -0.2, -0.3, -0.4, -2.0, -0.5],
...               "Paris is big. Rome?", "sentence")
>>> [(s.text, round(s.nll, 2), s.num_tokens) for s in r.spans]
[('Paris is big.', 1.0, 4), ('Rome?', 2.5, 2)]
>>> r.least_certain().text, round(r.total_nll, 2)
('Rome?', 3.5)
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gnll.measures.logprobs import check_logprobs

__all__ = [
    "SPAN_KINDS",
    "Segment",
    "Span",
    "SpanReport",
    "assign_tokens",
    "json_segments",
    "sentence_segments",
    "span_nlls",
    "token_positions",
]

SpanKind = Literal["sentence", "json"]
SPAN_KINDS: tuple[str, ...] = ("sentence", "json")


@dataclass(frozen=True)
class Segment:
    """A character range ``text[start:end]`` of the answer and its name (``"1"``, ``"$.a[0]"``)."""

    start: int
    end: int
    path: str


@dataclass(frozen=True)
class Span:
    """One sentence or JSON field value and its share of the answer's NLL.

    Attributes
    ----------
    path:
        ``"1"``, ``"2"``, ... for sentences; a JSON path (``"$.name"``, ``"$.items[0].qty"``) for fields.
    text, start, end:
        The span's text, ``answer[start:end]`` (Python string offsets, in characters).
    nll:
        ``-sum`` of the log-probs of the tokens assigned to the span (0 when it has none).
    num_tokens:
        Tokens assigned to the span.
    straddling:
        Of those, tokens that also hold non-white-space characters outside the span (see the
        module's rule).
    """

    path: str
    text: str
    start: int
    end: int
    nll: float
    num_tokens: int
    straddling: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "nll": self.nll,
            "num_tokens": self.num_tokens,
            "straddling": self.straddling,
        }


@dataclass(frozen=True)
class SpanReport:
    """The spans of one answer, and what no span holds.

    ``sum(s.nll for s in spans) + unassigned_nll == total_nll`` (the answer's NLL, G-NLL for a greedy
    answer) up to float rounding, and the token counts add up the same way.
    """

    kind: str
    spans: tuple[Span, ...]
    unassigned_nll: float
    unassigned_tokens: int
    total_nll: float

    def least_certain(self) -> Span | None:
        """The span with the largest NLL (the first of equals), or None when there is none."""
        return max(self.spans, key=lambda s: s.nll, default=None)

    def max_nll(self) -> float:
        """The largest span NLL (the whole answer's NLL when there are no spans)."""
        top = self.least_certain()
        return top.nll if top is not None else self.total_nll

    def to_dict(self) -> dict[str, Any]:
        top = self.least_certain()
        return {
            "kind": self.kind,
            "spans": [s.to_dict() for s in self.spans],
            "unassigned_nll": self.unassigned_nll,
            "unassigned_tokens": self.unassigned_tokens,
            "least_certain_span": top.path if top is not None else None,
        }


# --- segmenters ------------------------------------------------------------------------------------

#: Words whose trailing period does not end a sentence (lower case, without the period).
_ABBREVIATIONS = frozenset(
    (  # noqa: SIM905 (one line of words reads better than 44 lines of strings)
        "mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx no vol fig jan feb mar apr "
        "jun jul aug sep sept oct nov dec inc ltd co corp gen gov sen rep u.s u.k a.m p.m"
    ).split()
)
# A sentence ends at . ! ? … (or their CJK forms), with any closing quotes and brackets after them,
# when white space follows; a line break always ends one.
_END = re.compile(r"[.!?…。！？]+[\"'”’)\]]*(?=\s)|\n")


def _ends_sentence(text: str, m: re.Match[str]) -> bool:
    if m.group() == "\n":
        return True
    if not m.group().startswith("."):
        return True
    word = re.search(r"(\S+)$", text[: m.start()])
    if word is None:
        return True
    w = word.group(1).lower().lstrip("(\"'“‘")
    if w in _ABBREVIATIONS:
        return False
    # initials ("J. K. Rowling") and ordinals in some languages ("1. Januar") do not end a sentence
    if len(w) == 1 and w.isalpha():
        return False
    nxt = text[m.end() :].lstrip()
    # a lower-case continuation ("approx. three") means the period was not an ending
    return not (nxt[:1].islower())


def sentence_segments(text: str) -> list[Segment]:
    """Sentences of ``text`` by rule (no model), each without its surrounding white space.

    A sentence ends at ``. ! ? …`` (with closing quotes or brackets) followed by white space, or at a
    line break; a period after a common abbreviation or a single letter, or followed by a lower-case
    word, does not end one.

    >>> [text[s.start:s.end] for text in ["Dr. Who met J. K. Rowling. She smiled!\\nOK"]
    ...  for s in sentence_segments(text)]
    ['Dr. Who met J. K. Rowling.', 'She smiled!', 'OK']
    """
    cuts = [0] + [m.end() for m in _END.finditer(text) if _ends_sentence(text, m)] + [len(text)]
    out: list[Segment] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        chunk = text[a:b]
        lead = len(chunk) - len(chunk.lstrip())
        trail = len(chunk) - len(chunk.rstrip())
        if b - trail > a + lead:
            out.append(Segment(a + lead, b - trail, str(len(out) + 1)))
    return out


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _walk(text: str, i: int, path: str, out: list[Segment]) -> int:
    """Parse the JSON value at ``text[i]``, append its leaf value spans, return the index after it."""
    i = _WS.match(text, i).end()
    ch = text[i : i + 1]
    if ch in ("{", "["):
        close = "}" if ch == "{" else "]"
        i = _WS.match(text, i + 1).end()
        if text[i : i + 1] == close:
            return i + 1
        n = 0
        while True:
            if ch == "{":
                if text[i : i + 1] != '"':
                    raise ValueError(f"expected a key at character {i}")
                key, i = json.decoder.scanstring(text, i + 1)
                i = _WS.match(text, i).end()
                if text[i : i + 1] != ":":
                    raise ValueError(f"expected ':' at character {i}")
                i = _walk(text, i + 1, _key_path(path, key), out)
            else:
                i = _walk(text, i, f"{path}[{n}]", out)
            n += 1
            i = _WS.match(text, i).end()
            if text[i : i + 1] == ",":
                i = _WS.match(text, i + 1).end()
                continue
            if text[i : i + 1] == close:
                return i + 1
            raise ValueError(f"expected ',' or {close!r} at character {i}")
    _, end = _DECODER.raw_decode(text, i)
    if ch == '"':  # a string's value is what is inside its quotes
        out.append(Segment(i + 1, end - 1, path))
    else:
        out.append(Segment(i, end, path))
    return end


def json_segments(text: str) -> list[Segment]:
    """The leaf values of the first JSON object or array in ``text``, addressed by JSON path.

    Text before the JSON (prose, a code fence) and after it is tolerated and belongs to no span.
    A string value's span is its content inside the quotes; keys, quotes, ``: , { } [ ]`` are in none.

    >>> t = 'Here: {"name": "Ada", "tags": ["x", 2], "n": {"ok": true}}'
    >>> [(s.path, t[s.start:s.end]) for s in json_segments(t)]
    [('$.name', 'Ada'), ('$.tags[0]', 'x'), ('$.tags[1]', '2'), ('$.n.ok', 'true')]

    Raises
    ------
    ValueError
        When ``text`` holds no JSON object or array.
    """
    for m in re.finditer(r"[{\[]", text):
        out: list[Segment] = []
        try:
            _walk(text, m.start(), "$", out)
        except (ValueError, IndexError):
            continue
        return out
    raise ValueError("the answer holds no JSON object or array")


# --- alignment and assignment -----------------------------------------------------------------------


def token_positions(tokens: Sequence[str], text: str) -> list[list[int]]:
    """For each token, the indices of the characters of ``text`` it produced (possibly none).

    The tokens' concatenation is aligned to ``text`` character by character (``difflib``), so leading
    white space the text was stripped of, a cut stop sequence, or ``"\\ufffd"`` pieces of a multi-byte
    character still land where they belong; characters of a replaced run are spread evenly over it.

    >>> token_positions([" Pa", "ris", "\\n"], "Paris")
    [[0, 1], [2, 3, 4], []]
    """
    joined = "".join(tokens)
    owner: list[int] = []
    for k, t in enumerate(tokens):
        owner.extend([k] * len(t))
    pos: list[list[int]] = [[] for _ in tokens]
    off = joined.find(text) if text else -1
    if off >= 0:
        for c in range(len(text)):
            pos[owner[off + c]].append(c)
        return pos
    sm = difflib.SequenceMatcher(None, joined, text, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            for d in range(i2 - i1):
                pos[owner[i1 + d]].append(j1 + d)
        elif op == "replace":
            for d in range(i2 - i1):
                lo = j1 + d * (j2 - j1) // (i2 - i1)
                hi = max(lo + 1, j1 + (d + 1) * (j2 - j1) // (i2 - i1))
                pos[owner[i1 + d]].extend(range(lo, hi))
    return [sorted(set(p)) for p in pos]


def assign_tokens(
    tokens: Sequence[str], text: str, segments: Sequence[Segment]
) -> tuple[list[int], list[bool]]:
    """Which segment each token goes to under the module's straddling rule (``-1``: none), and
    whether it straddles (holds non-white-space characters outside that segment).

    ``segments`` must not overlap. The one home of the rule: :func:`span_nlls` sums by it, and
    callers that must say which tokens a span scored (``gnll.toolcalls``) read it here.

    >>> assign_tokens(["[", "1", "2,", " 3]"], "[12, 3]", [Segment(1, 3, "0"), Segment(5, 6, "1")])
    ([-1, 0, 0, 1], [False, False, True, True])
    """
    where = [-1] * len(text)  # the segment each character is in
    for n, s in enumerate(segments):
        where[s.start : s.end] = [n] * (s.end - s.start)
    owners: list[int] = []
    crossing: list[bool] = []
    for chars in token_positions(tokens, text):
        solid = [c for c in chars if not text[c].isspace()] or chars
        counts: dict[int, int] = {}
        for c in solid:
            if where[c] >= 0:
                counts[where[c]] = counts.get(where[c], 0) + 1
        if not counts:
            owners.append(-1)
            crossing.append(False)
            continue
        best = max(sorted(counts), key=lambda n: counts[n])  # ties: the earlier segment
        owners.append(best)
        crossing.append(any(where[c] != best for c in solid))
    return owners, crossing


def span_nlls(
    tokens: Sequence[str],
    token_logprobs: Sequence[float] | np.ndarray,
    text: str,
    kind: SpanKind | Sequence[Segment] = "sentence",
) -> SpanReport:
    """Split an answer's NLL over its sentences or JSON field values.

    Parameters
    ----------
    tokens, token_logprobs:
        The answer's tokens as decoded strings and ``log p`` of each (a :class:`~gnll.Generation`'s or a
        :class:`~gnll.ScoredAnswer`'s ``tokens`` and ``token_logprobs``).
    text:
        The answer's text.
    kind:
        ``"sentence"``, ``"json"``, or your own segments (non-overlapping :class:`Segment`\\ s).

    Returns
    -------
    SpanReport
        One :class:`Span` per segment, and the NLL and count of the tokens in no span.

    Raises
    ------
    ValueError
        On ``kind="json"`` when the answer holds no JSON, or mismatched lengths; a
        :class:`~gnll.measures.LogprobError` (a ``ValueError``) for a log-prob that is missing,
        NaN, infinite, a server's -9999 stand-in or positive (round-off above 0 is clamped).
    """
    if len(tokens) != len(token_logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(token_logprobs)} log-probs")
    # round-off above 0 is clamped, as for every G-NLL, so the parts add up to the same total
    token_logprobs = check_logprobs(token_logprobs, where="answer", tokens=tokens).tolist()
    if isinstance(kind, str):
        if kind == "sentence":
            segs = sentence_segments(text)
        elif kind == "json":
            segs = json_segments(text)
        else:
            raise ValueError(f"unknown span kind {kind!r}; use one of {', '.join(SPAN_KINDS)}")
        name = kind
    else:
        segs = sorted(kind, key=lambda s: s.start)
        for a, b in zip(segs, segs[1:], strict=False):
            if b.start < a.end:
                raise ValueError(f"segments {a.path!r} and {b.path!r} overlap")
        name = "custom"
    owners, crossing = assign_tokens(tokens, text, segs)
    members: list[list[int]] = [[] for _ in segs]
    straddling = [0] * len(segs)
    free: list[int] = []
    for k, (n, cross) in enumerate(zip(owners, crossing, strict=True)):
        if n < 0:
            free.append(k)
            continue
        members[n].append(k)
        straddling[n] += cross
    spans = tuple(
        Span(
            s.path,
            text[s.start : s.end],
            s.start,
            s.end,
            0.0 - math.fsum(token_logprobs[k] for k in ks),
            len(ks),
            straddling[n],
        )
        for n, (s, ks) in enumerate(zip(segs, members, strict=True))
    )
    return SpanReport(
        name,
        spans,
        0.0 - math.fsum(token_logprobs[k] for k in free),
        len(free),
        0.0 - math.fsum(token_logprobs),
    )
