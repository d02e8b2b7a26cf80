"""The ``gnll`` command: one Typer app, one module per sub-command, registered here explicitly.

A command module defines a plain function and never imports this module (no import cycle); adding
a command is one import and one ``command(...)`` line below. Command modules import heavy libraries
inside the command, so ``gnll --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from gnll.cli import (
    ask,
    calibrate,
    decide,
    doctor,
    evaluate,
    generate,
    score,
    serve,
    simulate,
    table,
)
from gnll.cli._conventions import Command
from gnll.cli._errors import error_boundary

app = typer.Typer(
    name="gnll",
    help="Uncertainty of LLM answers: G-NLL and the sampling-based baselines.",
    no_args_is_help=True,
    add_completion=False,
    # Frame locals hold model_args, and model_args may hold an API key.
    pretty_exceptions_show_locals=False,
    # Inherited by every command: `gnll score -h` works as `gnll score --help`.
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from gnll import __version__

        typer.echo(f"gnll {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Uncertainty of LLM answers: G-NLL and the sampling-based baselines."""


def command(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` as ``gnll NAME`` behind the one error boundary (``--debug``, exit codes)."""
    app.command(name, cls=Command)(error_boundary(fn))


command("ask", ask.ask)
command("eval", evaluate.evaluate)
command("table", table.table)
command("simulate", simulate.simulate)
command("score", score.score_command)
command("decide", decide.decide_command)
command("generate", generate.generate)
command("calibrate", calibrate.calibrate)
command("serve", serve.serve)
command("doctor", doctor.doctor)


if __name__ == "__main__":  # python -m gnll.cli.main
    app()
