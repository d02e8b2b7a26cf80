"""The manual spells every gnll option as its help does (``--max_new_tokens``, ``--output``): one
spelling, not a mix of the hidden aliases (``--max-new-tokens``, ``--output_path``).

Checked where an option is gnll's: on a ``gnll ...`` command line of a code block (with its
``\\`` continuation lines) and in an inline code span of the prose. Other tools' flags
(``vllm serve --max-model-len``) are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from gnll.cli._conventions import canonical
from gnll.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
GNLL = re.compile(r"\bgnll (ask|score|generate|eval|serve|calibrate|table|simulate|doctor)\b")


def _gnll_options() -> set[str]:
    names = set()
    for command in typer.main.get_command(app).commands.values():
        for param in command.params:
            names |= {canonical(o) for o in [*param.opts, *param.secondary_opts] if o[:2] == "--"}
    return names


def _misspelled(path: Path, names: set[str]) -> list[str]:
    found, fence, continued = [], False, False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence, continued = not fence, False
            continue
        if fence:
            ours = continued or bool(GNLL.search(line))
            continued = ours and line.rstrip().endswith("\\")
            texts = [line] if ours else []
        else:
            texts = [t for t in re.findall(r"`([^`]*)`", line) if t[:2] == "--" or GNLL.search(t)]
        for text in texts:
            for token in OPTION.findall(text):
                if canonical(token) in names and canonical(token) != token:
                    found.append(f"{path.relative_to(ROOT)}:{i}: {token} -> {canonical(token)}")
    return found


def test_the_manual_spells_options_as_the_help_does():
    names = _gnll_options()
    assert {"--max_new_tokens", "--output", "--prompt_format", "--overwrite"} <= names
    wrong = [w for page in PAGES for w in _misspelled(page, names)]
    assert not wrong, "options spelled unlike the help:\n" + "\n".join(wrong)
