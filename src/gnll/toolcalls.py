"""Tool calls in a model's output: the documented tool prompt, the call format and its grammar, the
parse, and where in each call the doubt sits.

A model whose chat template has no tool section (SmolLM2's and Gemma-3's have none) is told about the
tools by :func:`tool_system_prompt` and calls one by writing, for each call, a JSON object between
tags (the format Hermes-style templates use)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

:func:`parse_output` reads such an output strictly (each block one JSON object with a known
``name`` and an ``arguments`` object; anything else is no call). :func:`call_grammar` is the
same format as a Lark grammar with JSON schemas (llguidance's dialect), for constrained decoding
when the request *requires* a call.

**The partition.** Every output token goes to exactly one part (:func:`gnll.spans.assign_tokens`):
a call's function name (inside its quotes), one argument value (a leaf of ``arguments``, a string's
content inside its quotes), the rest of that call's JSON (keys, quotes, punctuation: its
``structure``), or outside every call (tags, white space, text: ``outside``). So each call's
``g_nll`` is ``name_nll + sum(argument nlls) + structure_nll``, and the calls' ``g_nll`` plus the
outside NLL is the whole output's.

>>> out = '<tool_call>\\n{"name": "f", "arguments": {"x": 2}}\\n</tool_call>'
>>> [(c.name, c.arguments) for c in parse_output(out, ["f"]).calls]
[('f', {'x': 2})]
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gnll.spans import Segment, assign_tokens, json_segments

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "UNCLOSED",
    "ParsedCall",
    "ParsedOutput",
    "call_grammar",
    "call_report",
    "json_grammar",
    "locate_calls",
    "parse_output",
    "render_call",
    "tool_chat_template",
    "tool_conversation",
    "tool_system_prompt",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
#: How :func:`parse_output`'s error for a block without its closing tag begins.
UNCLOSED = f"a {CALL_OPEN} block is not closed by {CALL_CLOSE}"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"\n?(.*?)\n?" + re.escape(CALL_CLOSE), re.S)


def tool_system_prompt(tools: Sequence[Mapping[str, Any]], system: str = "") -> str:
    """The system message that tells a model without a tool-aware template about ``tools``.

    ``tools`` are OpenAI tool definitions (``{"type": "function", "function": {...}}``); ``system``
    is the request's own system message, kept first.
    """
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    text = (
        "You can call functions. They are listed below as JSON, one per line, between <tools> and "
        f"</tools>:\n<tools>\n{listed}\n</tools>\n"
        "To call a function, answer with a JSON object "
        '{"name": <function name>, "arguments": <the arguments as a JSON object>} between '
        f"{CALL_OPEN} and {CALL_CLOSE} tags, one block per call, and nothing else:\n"
        f'{CALL_OPEN}\n{{"name": "example_function", "arguments": {{"x": 1}}}}\n{CALL_CLOSE}\n'
        "To answer without calling a function, answer in plain text."
    )
    return f"{system}\n\n{text}" if system else text


def render_call(name: str, arguments: str | Mapping[str, Any]) -> str:
    """One call as the documented format writes it (an assistant turn that called a tool)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}\n{CALL_CLOSE}'


def tool_conversation(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, str]]:
    """A conversation as plain ``{role, content}`` turns for a template without a tool section:
    with ``tools``, the tool prompt (:func:`tool_system_prompt`) joins the leading system (and
    ``developer``) messages; earlier calls (an assistant message's ``tool_calls``) are written in
    the documented format and tool results are user turns in ``<tool_response>`` tags
    (templates without a tool role accept them). ``content`` is each message's text (``None``:
    empty). What ``gnll serve`` renders in-process and ``gnll score`` scores after.
    """
    turns: list[dict[str, str]] = []
    system = ""
    for m in messages:
        role, text = str(m.get("role")), str(m.get("content") or "")
        if role in ("system", "developer") and not turns and tools is not None:
            system = f"{system}\n\n{text}".strip()
            continue
        if role == "assistant" and m.get("tool_calls"):
            blocks = [
                render_call(c["function"]["name"], c["function"].get("arguments") or "{}")
                for c in m["tool_calls"]
            ]
            turns.append(
                {"role": "assistant", "content": "\n".join(([text] if text else []) + blocks)}
            )
        elif role == "tool":
            turns.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
        else:
            turns.append({"role": "system" if role == "developer" else role, "content": text})
    if tools is not None:
        turns.insert(0, {"role": "system", "content": tool_system_prompt(tools, system)})
    return turns


#: JSON as ``json.dumps`` writes it (``", "`` and ``": "``, no other white space): one spelling of
#: each value, so the grammar leaves the model no choice that is only layout.
_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def _strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An object schema that does not say otherwise allows no properties it does not list."""
    out = dict(schema)
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _schema(fn: Mapping[str, Any]) -> dict[str, Any]:
    params = _strict(fn.get("parameters") or {"type": "object", "properties": {}})
    return {
        "x-guidance": _LAYOUT,
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_grammar(functions: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
    """A Lark grammar (llguidance's dialect: ``%json`` embeds a JSON schema) for output that is one
    call (or, with ``parallel``, one or more calls) of one of ``functions`` in the documented
    format, its arguments valid under the function's ``parameters`` schema.

    ``functions`` are the ``function`` objects of the tools the call may name.
    """
    if not functions:
        raise ValueError("a call grammar needs at least one function")
    alts = " | ".join(f"fn{i}" for i in range(len(functions)))
    rules = "\n".join(
        f"fn{i}: %json {json.dumps(_schema(fn), ensure_ascii=False)}"
        for i, fn in enumerate(functions)
    )
    repeat = ' ("\\n" block)*' if parallel else ""
    return (
        f"start: block{repeat}\n"
        f'block: "{CALL_OPEN}\\n" call "\\n{CALL_CLOSE}"\n'
        f"call: {alts}\n{rules}\n"
    )


def json_grammar(schema: Mapping[str, Any] | None = None) -> str:
    """A Lark grammar for one JSON value under ``schema`` (``None``: any JSON object)."""
    body = {"x-guidance": _LAYOUT, **(dict(schema) if schema is not None else {"type": "object"})}
    return f"start: %json {json.dumps(body, ensure_ascii=False)}\n"


@dataclass(frozen=True)
class ParsedCall:
    """One call found in an output: its parts as character ranges of the output."""

    name: str
    arguments: dict[str, Any]
    #: The exact text of the arguments object, as the model wrote it.
    arguments_text: str
    #: ``output[start:end]`` is the call's JSON object.
    start: int
    end: int
    #: The function name inside its quotes.
    name_segment: Segment
    #: The arguments' leaf values (paths relative to ``arguments``: ``"city"``, ``"dims[0]"``).
    argument_segments: tuple[Segment, ...]


@dataclass(frozen=True)
class ParsedOutput:
    """An output split into text and calls (``calls`` empty: a plain answer)."""

    content: str
    calls: tuple[ParsedCall, ...] = field(default_factory=tuple)
    #: Why a block that looked like a call is not one (``None``: nothing was dropped).
    error: str | None = None


def _call_at(text: str, start: int, end: int, key: str | None) -> ParsedCall:
    """The call whose JSON object is ``text[start:end]``: ``{"name": ..., key: {...}}``, or (``key``
    ``None``) the arguments object alone, whose function name then has no tokens."""
    body = text[start:end]
    obj = json.loads(body)
    segs = json_segments(body)
    if key is None:
        name, args = None, obj
        name_seg = Segment(start, start, "name")
        prefix, args_text = "$", body
    else:
        name, args = obj["name"], obj[key]
        found = next(s for s in segs if s.path == "$.name")
        name_seg = Segment(start + found.start, start + found.end, "name")
        prefix = f"$.{key}"
        # the arguments object's own text: from the value after "<key>": to its closing brace
        m = re.search(rf'"{key}"\s*:\s*', body)
        assert m is not None  # json.loads saw the key
        _, stop = json.JSONDecoder().raw_decode(body, m.end())
        args_text = body[m.end() : stop]
    arg_segs = tuple(
        Segment(start + s.start, start + s.end, s.path[len(prefix) :].lstrip("."))
        for s in segs
        if s.path.startswith((prefix + ".", prefix + "["))
    )
    return ParsedCall(
        name=str(name) if name is not None else "",
        arguments=args,
        arguments_text=args_text,
        start=start,
        end=end,
        name_segment=name_seg,
        argument_segments=arg_segs,
    )


def _parse_block(text: str, start: int, end: int, names: Sequence[str]) -> ParsedCall:
    body = text[start:end]
    lead = len(body) - len(body.lstrip())
    body = body.strip()
    start += lead
    end = start + len(body)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a tool call is not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or set(obj) != {"name", "arguments"}:
        raise ValueError('a tool call must be an object with exactly "name" and "arguments"')
    name, args = obj["name"], obj["arguments"]
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"a tool call names no known function: {name!r}")
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {name} are not a JSON object")
    return _call_at(text, start, end, "arguments")


def parse_output(text: str, names: Sequence[str]) -> ParsedOutput:
    """The calls in ``text`` (the documented format), strictly: every ``<tool_call>`` block must be
    one JSON object ``{"name": known, "arguments": {...}}``, or the output is a plain answer and
    ``error`` says why. Text outside the blocks is the ``content``.
    """
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        if CALL_OPEN in text:
            return ParsedOutput(text, (), UNCLOSED)
        return ParsedOutput(text)
    calls = []
    try:
        for m in blocks:
            calls.append(_parse_block(text, m.start(1), m.end(1), names))
    except ValueError as exc:
        return ParsedOutput(text, (), str(exc))
    content = _BLOCK.sub("", text)
    error = None
    if CALL_OPEN in content:  # a block cut off (max_tokens) or left open: not a call, not text
        content = content[: content.index(CALL_OPEN)]
        error = f"{UNCLOSED} (dropped)"
    return ParsedOutput(content.strip(), tuple(calls), error)


def _nll(lps: Sequence[float], ks: Sequence[int]) -> float:
    return 0.0 - math.fsum(lps[k] for k in ks)


def call_report(
    tokens: Sequence[str],
    token_logprobs: Sequence[float],
    text: str,
    calls: Sequence[ParsedCall],
    *,
    constrained_logprobs: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Per call: its G-NLL, its function name's NLL, each argument value's NLL over that value's
    tokens only, and the indices of the tokens each part scored (see the module's partition).

    ``constrained_logprobs``: the same tokens' log-probs renormalised over the tokens a grammar
    allowed (constrained decoding); each part then also has its ``constrained_nll``. The other
    NLLs are always the model's raw distribution's.
    """
    if len(tokens) != len(token_logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(token_logprobs)} log-probs")
    regions = [Segment(c.start, c.end, str(i)) for i, c in enumerate(calls)]
    in_call, _ = assign_tokens(tokens, text, regions)
    fine: list[Segment] = []
    for c in calls:
        fine.append(c.name_segment)
        fine.extend(c.argument_segments)
    part, crossing = assign_tokens(tokens, text, fine)
    lps = list(token_logprobs)
    clps = list(constrained_logprobs) if constrained_logprobs is not None else None
    out: list[dict[str, Any]] = []
    base = 0
    for i, c in enumerate(calls):
        own = [k for k, n in enumerate(in_call) if n == i]
        segs = [c.name_segment, *c.argument_segments]
        members = [[k for k in own if part[k] == base + j] for j in range(len(segs))]
        base += len(segs)
        used = {k for ks in members for k in ks}
        structure = [k for k in own if k not in used]

        def piece(ks: list[int], seg: Segment | None = None) -> dict[str, Any]:
            d: dict[str, Any] = {"nll": _nll(lps, ks), "num_tokens": len(ks), "token_indices": ks}
            if seg is not None:
                d = {"path": seg.path, "text": text[seg.start : seg.end], **d}
                d["straddling"] = sum(crossing[k] for k in ks)
            if clps is not None:
                d["constrained_nll"] = _nll(clps, ks)
            return d

        args = [piece(ks, s) for s, ks in zip(c.argument_segments, members[1:], strict=True)]
        top = max(args, key=lambda a: a["nll"], default=None)
        rec = {
            "index": i,
            "name": c.name,
            "g_nll": _nll(lps, own),
            "num_tokens": len(own),
            "token_indices": own,
            "name_nll": piece(members[0])["nll"],
            "name_tokens": members[0],
            "arguments": args,
            "structure_nll": _nll(lps, structure),
            "structure_tokens": structure,
            "least_certain_argument": top["path"] if top is not None else None,
            "max_argument_nll": top["nll"] if top is not None else None,
        }
        if clps is not None:
            rec["constrained_g_nll"] = _nll(clps, own)
            rec["constrained_name_nll"] = _nll(clps, members[0])
        out.append(rec)
    return out


# --- calls a server parsed, found in the output its log-probs spell ------------------------------

#: Keys servers' tool parsers read the arguments from, beside the name (Hermes-style templates
#: write ``arguments``; Llama-3-style JSON calls ``parameters``).
_ARGUMENT_KEYS = ("arguments", "parameters")


def _envelope_key(obj: Any, name: str, arguments: Any) -> str | None:
    if not isinstance(obj, dict) or obj.get("name") != name or len(obj) != 2:
        return None
    for key in _ARGUMENT_KEYS:
        if key in obj:
            value = obj[key]
            if isinstance(value, str):  # some models write the arguments as a JSON string
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    return None
            return key if value == arguments else None
    return None


def locate_calls(
    text: str, calls: Sequence[tuple[str, str | Mapping[str, Any]]]
) -> tuple[ParsedCall, ...]:
    """Find the calls a server's tool parser returned (``message.tool_calls``: ``(name,
    arguments)`` in order, the arguments as a JSON string or an object) in the output the model
    wrote (the text its log-probs spell), so that each call's tokens can be scored.

    A call is the first JSON object, after the previous call, that is ``{"name": name,
    "arguments": args}`` (or ``"parameters"``, Llama-3-style; the arguments compared as JSON
    values, so a parser that re-serialises them still matches); failing that, the arguments
    object alone (a server that decodes a named ``tool_choice`` as the arguments only: the
    function name then has no tokens and ``name_nll`` is 0). The markers around a call
    (``<tool_call>`` tags, special tokens) lie outside it, as in :func:`parse_output`.

    >>> out = '<tool_call>\\n{"name": "f", "arguments": {"x": 2}}\\n</tool_call>'
    >>> [c] = locate_calls(out, [("f", '{"x":2}')])
    >>> out[c.start:c.end], out[c.name_segment.start:c.name_segment.end], c.argument_segments[0].path
    ('{"name": "f", "arguments": {"x": 2}}', 'f', 'x')

    Raises
    ------
    ValueError
        A call is not in ``text`` (its log-probs cannot be told apart), naming it.
    """
    decoder = json.JSONDecoder()
    out: list[ParsedCall] = []
    pos = 0
    for k, (name, arguments) in enumerate(calls):
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"tool call {k} ({name}): its arguments are not JSON") from None
        objects = []
        for m in re.finditer(r"\{", text[pos:]):
            try:
                obj, end = decoder.raw_decode(text, pos + m.start())
            except ValueError:
                continue
            objects.append((pos + m.start(), end, obj))
        found = next(
            (
                _call_at(text, a, b, key)
                for a, b, obj in objects
                if (key := _envelope_key(obj, name, args)) is not None
            ),
            None,
        )
        if found is None:
            found = next((_call_at(text, a, b, None) for a, b, obj in objects if obj == args), None)
            if found is not None:
                found = replace(found, name=name)
        if found is None:
            raise ValueError(
                f"tool call {k} ({name}) is not in the output its log-probs spell, so its "
                "tokens cannot be told apart"
            )
        out.append(found)
        pos = found.end
    return tuple(out)


# --- the documented tool prompt as a chat template (for a server) -----------------------------

#: A Jinja prelude that rewrites ``messages`` as :func:`tool_system_prompt` and the documented call
#: format do (``gnll.serving.tools.render_messages``), then lets the model's own template render
#: them. Written on one line: servers render with ``trim_blocks``/``lstrip_blocks``.
_PRELUDE = (
    "{%- if tools -%}"
    '{%- set ns = namespace(system="", lead=true, turns=[], listed=[], blocks=[], fields=[]) -%}'
    "{%- for m in messages -%}"
    '{%- set text = m.content if m.content is string else "" -%}'
    '{%- if ns.lead and m.role in ["system", "developer"] -%}'
    '{%- set ns.system = (ns.system ~ "\\n\\n" ~ text) | trim -%}'
    "{%- else -%}{%- set ns.lead = false -%}"
    '{%- if m.role == "assistant" and m.tool_calls -%}'
    "{%- set ns.blocks = [text] if text else [] -%}"
    "{%- for c in m.tool_calls -%}"
    "{%- set a = c.function.arguments -%}"
    '{%- set a = (a | tojson) if a is mapping else (a or "{}") -%}'
    '{%- set ns.blocks = ns.blocks + ["<tool_call>\\n{\\"name\\": " ~ (c.function.name | tojson) ~ '
    '", \\"arguments\\": " ~ a ~ "}\\n</tool_call>"] -%}'
    "{%- endfor -%}"
    '{%- set ns.turns = ns.turns + [{"role": "assistant", "content": ns.blocks | join("\\n")}] -%}'
    '{%- elif m.role == "tool" -%}'
    '{%- set ns.turns = ns.turns + [{"role": "user", "content": "<tool_response>\\n" ~ text ~ '
    '"\\n</tool_response>"}] -%}'
    "{%- else -%}"
    '{%- set ns.turns = ns.turns + [{"role": "system" if m.role == "developer" else m.role, '
    '"content": text}] -%}'
    "{%- endif -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for t in tools -%}"
    "{%- set f = t.function -%}{%- set ns.fields = [] -%}"
    '{%- for key in ["name", "description", "parameters", "strict"] -%}'
    "{%- if f[key] is defined and f[key] is not none -%}"
    '{%- set ns.fields = ns.fields + [(key | tojson) ~ ": " ~ (f[key] | tojson)] -%}'
    "{%- endif -%}{%- endfor -%}"
    '{%- set ns.listed = ns.listed + ["{\\"type\\": \\"function\\", \\"function\\": {" ~ '
    'ns.fields | join(", ") ~ "}}"] -%}'
    "{%- endfor -%}"
    '{%- set prompt = "{PROMPT}" -%}'
    '{%- set prompt = prompt | replace("{TOOLS}", ns.listed | join("\\n")) -%}'
    '{%- set prompt = (ns.system ~ "\\n\\n" ~ prompt) if ns.system else prompt -%}'
    '{%- set messages = [{"role": "system", "content": prompt}] + ns.turns -%}'
    "{%- set tools = none -%}"
    "{%- endif -%}"
)


def tool_chat_template(template: str) -> str:
    """A model's chat template extended to render ``tools`` as gnll does: with tools, the
    documented tool prompt (:func:`tool_system_prompt`) joins the system message, earlier calls
    are written as ``<tool_call>`` blocks and tool results as user turns in ``<tool_response>``
    tags, and the model's own template renders the result; without tools, the template renders
    exactly as before. For a server (vLLM's ``--chat-template``, with ``--enable-auto-tool-choice
    --tool-call-parser hermes``, which reads this call format) in front of a model whose own
    template has no tool section.

    Earlier calls' arguments render byte-identically to gnll's in-process prompt when they are
    written as ``json.dumps`` writes them (servers hand templates the arguments parsed).
    """
    marker = "\u0000TOOLS\u0000"
    prompt = tool_system_prompt([{"_": marker}])
    listed = json.dumps({"_": marker}, ensure_ascii=False)
    escaped = prompt.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    escaped = escaped.replace(listed.replace("\\", "\\\\").replace('"', '\\"'), "{TOOLS}")
    return _PRELUDE.replace('"{PROMPT}"', '"' + escaped + '"') + template
