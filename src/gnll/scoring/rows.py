"""Streaming input of ``gnll score``: JSONL, CSV or Parquet rows, one at a time, each checked.

Every row comes out as ``(line, row, error)``: ``line`` is the 1-based line of the row in the file
(JSONL, CSV: the physical line where the row ends; Parquet: the row number), ``row`` the parsed dict
(``None`` if unreadable) and ``error`` a short message naming the field, or ``None``. Nothing is held
beyond the current row, so memory does not grow with the file.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from gnll.backends.prompting import prompt_for

__all__ = ["Item", "check_columns", "count_rows", "iter_rows", "to_item"]

PROMPT_FIELDS = ("messages", "prompt", "question")
#: What every ``gnll score`` row needs: an answer, and something it answers.
SCORE_COLUMNS = (("answer",), ("question", "prompt", "messages"))
LABEL_FIELDS = ("correct", "label")
#: A reasoning model's trace, scored as context before the answer.
TRACE_FIELDS = ("trace", "reasoning")

Row = tuple[int, dict[str, Any] | None, str | None]


def _open_binary(path: str) -> BinaryIO:
    return sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115


def _jsonl(fh: BinaryIO) -> Iterator[Row]:
    for line, raw in enumerate(fh, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield line, None, f"not valid UTF-8 (byte {e.start})"
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            yield line, None, f"not valid JSON ({e.msg}, column {e.colno})"
            continue
        if not isinstance(row, dict):
            yield line, None, f"expected a JSON object, got {type(row).__name__}"
            continue
        yield line, row, None


def _has_surrogates(values: Any) -> bool:
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)


def _csv(fh: BinaryIO) -> Iterator[Row]:
    # surrogateescape keeps going past undecodable bytes; the row holding them is then reported.
    text = io.TextIOWrapper(fh, encoding="utf-8", errors="surrogateescape", newline="")
    reader = csv.DictReader(text)
    for row in reader:
        line = reader.line_num
        if None in row:
            yield line, None, f"{len(row[None])} more field(s) than the header has"
            continue
        if _has_surrogates(row.values()):
            yield line, None, "not valid UTF-8"
            continue
        yield line, {k: v for k, v in row.items() if v is not None}, None


def _parquet(path: str) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'gnll[parquet]'") from None
    line = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            line += 1
            yield line, row, None


def iter_rows(path: str, fmt: str) -> Iterator[Row]:
    """Stream ``(line, row, error)`` from ``path`` (``-``: stdin, JSONL)."""
    if fmt == "parquet":
        if path == "-":
            raise ValueError("Parquet cannot be read from stdin; give a file")
        yield from _parquet(path)
        return
    fh = _open_binary(path)
    try:
        yield from (_jsonl(fh) if fmt == "jsonl" else _csv(fh))
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def columns(path: str, fmt: str) -> list[str] | None:
    """The header of a CSV or Parquet file; ``None`` where rows have no common header (JSONL,
    stdin)."""
    if path == "-" or fmt == "jsonl":
        return None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(path).schema_arrow.names)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
        return next(csv.reader(fh), [])


def check_columns(path: str, fmt: str, required: tuple[tuple[str, ...], ...]) -> None:
    """Refuse, once, a file whose header lacks a column every row needs (each of ``required`` is a
    group of alternatives), instead of one identical error per row.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.csv"
    >>> _ = p.write_text("id,question\\n1,Who?\\n")
    >>> check_columns(str(p), "csv", SCORE_COLUMNS)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: .../a.csv has no 'answer' column (its columns: id, question), which every row needs
    """
    names = columns(path, fmt)
    if names is None:
        return
    for group in required:
        if not any(c in names for c in group):
            want = " or ".join(repr(c) for c in group)
            raise ValueError(
                f"{path} has no {want} column (its columns: {', '.join(names) or 'none'}), "
                "which every row needs"
            )


def count_rows(path: str, fmt: str) -> int | None:
    """Rows in a file, for the progress bar's total (one cheap pass; ``None`` for stdin)."""
    if path == "-":
        return None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    n = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            n += block.count(b"\n")
    return n - 1 if fmt == "csv" else n


@dataclass
class Item:
    """One valid input row, ready to score: its prompt in its :mod:`prompt format
    <gnll.backends.prompting>` (``question``: ``instruction``; ``messages``: ``chat``;
    ``prompt``: ``chat``, or ``text`` with ``--raw-prompt``)."""

    line: int
    row: dict[str, Any]
    prompt: str
    answer: str
    raw_prompt: bool
    prompt_format: str = "chat"
    #: A reasoning model's trace (the row's ``trace`` or ``reasoning`` field): context the answer
    #: is scored after, not part of it.
    trace: str | None = None
    #: The functions a tool-call answer names (its ``tool_calls`` column is reported per call).
    tool_names: list[str] | None = None


def to_item(
    line: int,
    row: dict[str, Any],
    *,
    long: bool,
    render_messages: Callable[[list[dict[str, Any]]], str] | None,
    raw_prompt: bool,
) -> Item | str:
    """Check a row and build its prompt; return an :class:`Item` or an error message.

    ``render_messages`` (the model's :meth:`~gnll.backends.base.Model.render_chat`, ``None``
    for a model without a chat template) checks that the template takes a row's ``messages``.
    """
    answer = row.get("answer")
    if answer is None:
        return "missing field 'answer'"
    original = row
    calls: list[str] | None = None
    if isinstance(answer, (dict, list)):  # a JSON object, or a tool call (gnll.toolcalls)
        answer, calls = structured_answer(answer)
        if calls is not None and row.get("tools") and isinstance(row.get("messages"), list):
            row = {**row, "messages": _with_tools(row["messages"], row["tools"])}
    if not isinstance(answer, str):
        return f"field 'answer' must be a string, got {type(answer).__name__}"
    if not answer.strip():
        return "field 'answer' is empty"
    trace_field = next((f for f in TRACE_FIELDS if row.get(f) not in (None, "")), None)
    if trace_field is not None and not isinstance(row[trace_field], str):
        return f"field {trace_field!r} must be a string, got {type(row[trace_field]).__name__}"
    item = _to_item(
        line, row, answer, long=long, render_messages=render_messages, raw_prompt=raw_prompt
    )
    if isinstance(item, Item) and trace_field is not None:
        item.trace = row[trace_field]
    if isinstance(item, Item):
        item.row, item.tool_names = original, calls  # the output row keeps the row as given
    return item


def _call_of(c: Any) -> tuple[str, Any] | None:
    if isinstance(c, dict) and isinstance(c.get("function"), dict):  # OpenAI's tool_calls[i]
        c = c["function"]
    if isinstance(c, dict) and set(c) == {"name", "arguments"} and isinstance(c["name"], str):
        return c["name"], c["arguments"]
    return None


def structured_answer(answer: dict[str, Any] | list[Any]) -> tuple[Any, list[str] | None]:
    """A row's ``answer`` given as JSON: a tool call (``{"name", "arguments"}``, OpenAI's
    ``tool_calls`` list, or a message with ``tool_calls``) as the documented call blocks, with the
    functions it names; any other JSON object as its text (``json.dumps``), with ``None``.

    >>> structured_answer({"name": "f", "arguments": {"x": 1}})[0].splitlines()[1]
    '{"name": "f", "arguments": {"x": 1}}'
    >>> structured_answer({"city": "Paris"})
    ('{"city": "Paris"}', None)
    """
    from gnll.toolcalls import render_call

    items = (
        answer.get("tool_calls") if isinstance(answer, dict) and "tool_calls" in answer else answer
    )
    listed = items if isinstance(items, list) else [items]
    calls = [_call_of(c) for c in listed]
    if listed and all(c is not None for c in calls):
        pairs = [c for c in calls if c is not None]
        return "\n".join(render_call(n, a) for n, a in pairs), [n for n, _ in pairs]
    if isinstance(answer, dict):
        return json.dumps(answer, ensure_ascii=False), None
    return answer, None


def _with_tools(messages: list[Any], tools: Any) -> list[Any]:
    """``messages`` with the documented tool prompt as their system message and earlier calls
    and tool results in the documented format (as ``gnll serve`` renders a request with tools)."""
    from gnll.toolcalls import tool_conversation

    tools = json.loads(tools) if isinstance(tools, str) else tools
    if not all(isinstance(m, dict) for m in messages):
        return messages  # the row check names what is wrong
    return tool_conversation(messages, tools)


def _to_item(
    line: int,
    row: dict[str, Any],
    answer: str,
    *,
    long: bool,
    render_messages: Callable[[list[dict[str, Any]]], str] | None,
    raw_prompt: bool,
) -> Item | str:
    field = next((f for f in PROMPT_FIELDS if row.get(f) not in (None, "")), None)
    if field is None:
        return "missing field: one of 'question', 'prompt' or 'messages'"
    value = row[field]
    if field == "messages":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return "field 'messages' is not a JSON list of {role, content} objects"
        if not (
            isinstance(value, list)
            and value
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
        ):
            return "field 'messages' must be a non-empty list of {role, content} objects"
        if render_messages is None:
            return "field 'messages' needs a model with a chat template (or give 'prompt')"
        try:
            render_messages(value)
        except Exception as e:  # a template may reject a conversation (e.g. roles out of order)
            return f"field 'messages': the chat template rejected it ({e})"
        return _item(line, row, value, answer, "chat")
    if not isinstance(value, str):
        return f"field {field!r} must be a string, got {type(value).__name__}"
    if field == "question":
        return _item(line, row, value, answer, "instruction", long=long)
    return _item(line, row, value, answer, "text" if raw_prompt else "chat")


def _item(line: int, row: dict, value: Any, answer: str, fmt: str, *, long: bool = False) -> Item:
    prompt, raw = prompt_for(value, fmt, long=long)
    return Item(line, row, prompt, answer, raw, fmt)
