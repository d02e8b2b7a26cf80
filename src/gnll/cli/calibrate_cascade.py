"""``gnll calibrate --cascade SMALL LARGE``: the escalation threshold of a two-model cascade.

Example
-------
``gnll calibrate --cascade runs/small runs/large --target-accuracy 0.6 -o cascade.json`` joins the
two runs by question, prints the cascade's accuracy at escalation rates 10-50% (gated by the small
model's G-NLL, and at random), fits the threshold that keeps the cascade's accuracy >= 0.6 with
probability >= 1 - delta at the lowest escalation rate, and writes ``cascade.json``
(:meth:`gnll.calibration.cascade.CascadeThreshold.save`) and ``cascade.png``. Serve it with
``gnll serve --cascade cascade.json --escalate-to URL``.
"""

from __future__ import annotations

from pathlib import Path

from gnll.cli._errors import plain, usage_failer

__all__ = ["calibrate_cascade"]

RATES = (0.1, 0.2, 0.3, 0.4, 0.5)


def calibrate_cascade(
    inputs: list[Path],
    output: Path,
    plot: Path | None,
    measure: str,
    correctness: str | None,
    target_accuracy: str,
    delta: float,
    debug: bool,
) -> None:
    """Fit, print and write the cascade threshold (see the module docstring)."""
    from rich.console import Console
    from rich.table import Table

    from gnll.calibration.cascade import (
        accuracy_at_rate,
        cascade_threshold,
        load_cascade,
        random_accuracy_at_rate,
    )
    from gnll.calibration.plot import cascade_plot

    console = Console(stderr=True)

    fail = usage_failer(console, debug)

    if len(inputs) != 2:
        fail(f"--cascade takes two eval runs (SMALL LARGE), got {len(inputs)}")
    try:
        target = float(target_accuracy)
    except ValueError:
        fail(f"--cascade needs a number for --target-accuracy, got {target_accuracy!r}")
    try:
        data = load_cascade(inputs[0], inputs[1], measure=measure, correctness=correctness)
        fitted = cascade_threshold(data.scores, data.small, data.large, target=target, delta=delta)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc), exc)
    n = len(data.keys)
    console.print(
        f"{n} questions in both runs; accuracy {data.small_model}: {data.small.mean():.3f}, "
        f"{data.large_model}: {data.large.mean():.3f}"
        + (f"; {data.dropped} rows in only one run (left out)" if data.dropped else "")
    )
    table = Table(title=f"Cascade accuracy, escalating on {measure}", show_edge=False)
    for col in ("escalated", f"gated by {measure}", "random (expected)"):
        table.add_column(col, justify="right")
    rows = []
    for r in RATES:
        gated = accuracy_at_rate(data.scores, data.small, data.large, r)
        rand = random_accuracy_at_rate(data.small, data.large, r)
        rows.append({"escalation_rate": r, "gated": gated, "random": rand})
        table.add_row(f"{r:.0%}", f"{gated:.3f}", f"{rand:.3f}")
    console.print(table)
    if fitted.achievable:
        console.print(
            f"threshold: escalate when {measure} > {fitted.threshold:.4g} -> escalation rate "
            f"{fitted.escalation_rate:.3f}, accuracy {fitted.accuracy:.3f} (lower bound "
            f"{fitted.accuracy_lower:.3f}); accuracy >= {target:g} with probability {1 - delta:g}"
        )
    else:
        console.print(
            f"[yellow]accuracy >= {target:g} with probability {1 - delta:g} is out of reach even "
            f"escalating every question[/] (large model's accuracy {data.large.mean():.3f})"
        )
    plot = plot or output.with_suffix(".png")
    cascade_plot(data, plot, fitted=fitted)
    fitted.meta.update(data.meta(), at_rates=rows, plot=plot.name)
    fitted.save(output)
    console.print(f"[green]wrote[/] {plain(output)} and {plain(plot)}")
