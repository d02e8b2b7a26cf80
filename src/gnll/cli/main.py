"""The ``gnll`` command: one Typer app, one module per sub-command."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gnll",
    help="Uncertainty of LLM answers: G-NLL and the sampling-based baselines.",
    no_args_is_help=True,
    add_completion=False,
)

# Sub-commands register themselves on import; keep imports of heavy libraries inside the commands.
from gnll.cli import ask as _ask  # noqa: E402,F401
from gnll.cli import calibrate as _calibrate  # noqa: E402,F401
from gnll.cli import evaluate as _evaluate  # noqa: E402,F401
from gnll.cli import score as _score  # noqa: E402,F401
from gnll.cli import serve as _serve  # noqa: E402,F401
from gnll.cli import simulate as _simulate  # noqa: E402,F401
from gnll.cli import table as _table  # noqa: E402,F401
