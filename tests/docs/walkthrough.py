"""Read the runnable blocks of a Markdown walkthrough (docs/quickstart.md).

A fenced block runs when an HTML comment ``<!-- run ... -->`` stands on the line before it:

- ``<!-- run -->``: run the block (``bash`` with bash, ``python`` with Python);
- ``<!-- run: expect "A" "B" -->``: run it and require each quoted string in its output;
- ``<!-- run: file NAME -->``: write the block to NAME for a later block to use.

Blocks without the comment (installs, cluster recipes) are shown, not run. Blocks run strictly in
page order, files included: a block that uses a file the page shows only further down fails, as it
would for a reader pasting the blocks one after the other (:func:`used_before_written`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_RUN = re.compile(r"^<!--\s*run(?::\s*(?P<args>.*?))?\s*-->\s*$")
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")


@dataclass
class Block:
    """One runnable fenced block: its language, text, line in the file and what it must print."""

    lang: str
    code: str
    line: int
    expect: list[str] = field(default_factory=list)
    file: str | None = None


def runnable_blocks(path: Path) -> list[Block]:
    """The blocks of ``path`` marked ``<!-- run ... -->``, in document order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _RUN.match(lines[i].strip())
        if not m:
            i += 1
            continue
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{path}:{i + 1}: a run marker must stand right above a ``` fence")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{path}:{i + 2}: the fence is never closed")
        args = m.group("args") or ""
        file_m = re.match(r"file\s+(\S+)", args)
        blocks.append(
            Block(
                lang=fence.group("lang"),
                code="\n".join(lines[i + 2 : end]) + "\n",
                line=i + 2,
                expect=[s.replace('\\"', '"') for s in re.findall(r'"((?:[^"\\]|\\.)*)"', args)]
                if args.startswith("expect")
                else [],
                file=file_m.group(1) if file_m else None,
            )
        )
        i = end + 1
    return blocks


def used_before_written(blocks: list[Block]) -> list[str]:
    r"""Where a block uses a file (by name) that only a later ``file`` block writes.

    Examples
    --------
    >>> run = Block("bash", "python client.py\n", 3)
    >>> used_before_written([run, Block("python", "print(1)\n", 9, file="client.py")])
    ['line 3 uses client.py, which the page writes only at line 9']
    >>> used_before_written([Block("python", "print(1)\n", 1, file="client.py"), run])
    []
    """
    problems, written = [], set()
    for b in blocks:
        if b.file:
            written.add(b.file)
            continue
        for later in blocks:
            name = later.file
            if (
                name
                and name not in written
                and re.search(rf"(?<![\w./-]){re.escape(name)}\b", b.code)
            ):
                problems.append(
                    f"line {b.line} uses {name}, which the page writes only at line {later.line}"
                )
    return problems
