"""``gnll serve``'s command parses and prints: its body (after the signature and docstring) stays
under 78 lines, the rules it applies live in the library (gnll.policy, gnll.serving)."""

from __future__ import annotations

import ast
from pathlib import Path

import gnll.cli.serve


def _body_lines(path: Path, name: str) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
            return node.end_lineno - body[0].lineno + 1
    raise AssertionError(f"no function {name}")


def test_serve_command_body_is_under_78_lines():
    assert _body_lines(Path(gnll.cli.serve.__file__), "serve") < 78
