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
    allow_duplicates: Annotated[
        bool,
        typer.Option(
            "--allow_duplicates",
            help="Accept runs of the same model and task: their rows are labelled with the run "
            "directory and the overall average is left out (default: refused).",
        ),
    ] = False,
    average_rows: Annotated[
        str | None,
        typer.Option(
            "--average_rows",
            help="Rows of every overall Average (and its test): f1+judge (F1 and the first "
            "judge) or f1+judges (F1 and every judge). Default: the paper's per table, f1+judge "
            "for AUROC (Tables 1, 5), f1+judges for ARA@80 (Table 3).",
        ),
    ] = None,
    prr: Annotated[
        bool,
        typer.Option("--prr", help="Add LM-Polygraph's normalised PRR per task and measure."),
    ] = False,
) -> None:
    """Print (or write) the paper-style tables of one or more runs (rows: model/task/metric)."""
    from gnll.evaluation.results.groups import PAPER_AVERAGE_ROWS, check_average_rows
    from gnll.evaluation.results.report import averaged_significance, load_results, read_strata
    from gnll.evaluation.results.tables import DEFAULT_SECTIONS, render_table

    try:
        check_average_rows(average_rows)
        results = [load_results(d) for d in run_dirs]
        # Per-question data for the significance of averaged rows spanning several runs.
        strata = [read_strata(d) if Path(d).is_dir() else None for d in run_dirs]
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    from gnll.evaluation.results.groups import duplicates

    dup = duplicates(results)
    if dup and not allow_duplicates:
        lines = [
            f"{model} / {task} is in {' and '.join(str(run_dirs[i]) for i in runs)}"
            for (model, task), runs in dup.items()
        ]
        typer.echo(
            f"error: {'; '.join(lines)}: an average would count one dataset twice, so give each "
            "model and task once (or pass --allow_duplicates to list them as labelled rows)",
            err=True,
        )
        raise typer.Exit(code=2)
    labels = [Path(d).name or str(d) for d in run_dirs]
    tested = average_rows or PAPER_AVERAGE_ROWS["auroc_averaged"]
    significance = averaged_significance(results, strata, average_rows=tested)
    sections = [*DEFAULT_SECTIONS, "prr"] if prr else None
    text = render_table(
        results, significance, sections=sections, run_labels=labels, average_rows=average_rows
    )
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)
