"""The ``gnll`` command: one Typer app, one module per sub-command, registered here explicitly.

A command module defines a plain function and never imports this module (no import cycle); adding
a command is one import and one ``app.command`` line below. Command modules import heavy libraries
inside the command, so ``gnll --help`` stays fast.
"""

from __future__ import annotations

import typer

from gnll.cli import ask, calibrate, evaluate, score, serve, simulate, table

app = typer.Typer(
    name="gnll",
    help="Uncertainty of LLM answers: G-NLL and the sampling-based baselines.",
    no_args_is_help=True,
    add_completion=False,
    # Frame locals hold model_args, and model_args may hold an API key.
    pretty_exceptions_show_locals=False,
)

app.command("ask")(ask.ask)
app.command("eval")(evaluate.evaluate)
app.command("table")(table.table)
app.command("simulate")(simulate.simulate)
app.command("score")(score.score_command)
app.command("calibrate")(calibrate.calibrate)
app.command("serve")(serve.serve)
