"""One spelling per option on every command, with the others accepted as hidden aliases.

The project's convention is lm-eval's: words joined by underscores (``--max_new_tokens``,
``--model_args``, ``--no_progress``). Every command accepts the hyphenated spelling of every option
too (``--max-new-tokens``), and ``--output_path`` / ``--output-path`` for ``--output``, but the help
lists each option once, in the project's spelling. Command modules may declare options either way:
:class:`Command` rewrites the declared names and the typed ones to the same canonical form, so no
command can drift from its siblings again.

>>> canonical("--max-new-tokens=5"), canonical("--output_path"), canonical("-o")
('--max_new_tokens=5', '--output', '-o')
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

__all__ = ["ALIASES", "Command", "canonical"]

#: Hidden alias -> the one name in the help (after hyphens become underscores).
ALIASES = {"--output_path": "--output"}


def _name(opt: str) -> str:
    if not opt.startswith("--") or len(opt) <= 2:
        return opt
    name = "--" + opt[2:].replace("-", "_")
    return ALIASES.get(name, name)


def canonical(token: str) -> str:
    """A command-line token with its option name (not its ``=value``) in the canonical spelling."""
    if not token.startswith("--") or token == "--":
        return token
    name, sep, value = token.partition("=")
    return _name(name) + sep + value


def _dedupe(opts: list[str]) -> list[str]:
    return list(dict.fromkeys(_name(o) for o in opts))


class Command(TyperCommand):
    """A Typer command whose options have one canonical name each (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shorts = {o for p in self.params for o in getattr(p, "opts", []) if not o.startswith("--")}
        for param in self.params:
            if getattr(param, "param_type_name", "") != "option":
                continue
            param.opts = _dedupe(param.opts)
            param.secondary_opts = _dedupe(param.secondary_opts)
            # -o means --output on every command that writes one.
            if "--output" in param.opts and "-o" not in shorts:
                param.opts.append("-o")

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        out, options = [], True
        for token in args:
            if token == "--":
                options = False
            out.append(canonical(token) if options else token)
        return super().parse_args(ctx, out)
