"""``gnll table RUN_DIR [RUN_DIR ...]``: merge the results of several ``gnll eval`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["table"]


def table(
    run_dirs: Annotated[list[Path], typer.Argument(help="Output directories of `gnll eval` runs.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the markdown here instead of stdout."),
    ] = None,
) -> None:
    """Print (or write) the paper-style tables of one or more runs (rows: model/task/metric)."""
    from gnll.evaluation.results.report import averaged_significance, load_results, read_strata
    from gnll.evaluation.results.tables import render_table

    try:
        results = [load_results(d) for d in run_dirs]
        # Per-question data for the significance of averaged rows spanning several runs.
        strata = [read_strata(d) if Path(d).is_dir() else None for d in run_dirs]
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    text = render_table(results, averaged_significance(results, strata))
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)
