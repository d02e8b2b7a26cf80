"""``gnll calibrate``: fit P(correct) and abstention thresholds on labelled runs or scored files.

Example
-------
``gnll calibrate runs/demo --output calibration.json`` reads ``runs/demo/samples.jsonl``, picks
isotonic or Platt scaling by cross-validated log-loss, prints the held-out ECE / Brier / log-loss /
AUROC and the thresholds, and writes ``calibration.json`` and ``calibration.reliability.png``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from gnll.cli._errors import plain

__all__ = ["calibrate"]


def _opt_float(text: str, name: str) -> float | None:
    if text.lower() in ("none", "off", ""):
        return None
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(
            f"{name} must be a number in (0, 1) or 'none', got {text!r}"
        ) from None


def calibrate(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="`gnll eval` run directories (or their samples.jsonl) and/or scored files with a correct/label column."
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Calibration file to write.")
    ] = Path("calibration.json"),
    measure: Annotated[
        str, typer.Option("--measure", help="Measure (eval runs) or column (scored files).")
    ] = "g-nll",
    correctness: Annotated[
        str | None,
        typer.Option(
            "--correctness",
            help="Correctness metric of eval runs (default: each task's primary one).",
        ),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", help="auto (by CV log-loss), isotonic or platt.")
    ] = "auto",
    target_accuracy: Annotated[
        str,
        typer.Option("--target-accuracy", help="Accuracy among answered to guarantee, or 'none'."),
    ] = "0.8",
    target_coverage: Annotated[
        str, typer.Option("--target-coverage", help="Fraction answered to guarantee, or 'none'.")
    ] = "0.8",
    delta: Annotated[
        float, typer.Option("--delta", help="Guarantees hold with probability 1 - delta.")
    ] = 0.1,
    cv: Annotated[int, typer.Option("--cv", help="Cross-validation folds.")] = 5,
    bins: Annotated[int, typer.Option("--bins", help="ECE / reliability diagram bins.")] = 10,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model name to record (default: from the eval run)."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Reliability diagram PNG (default: next to --output)."),
    ] = None,
    prompt_format: Annotated[
        str | None,
        typer.Option(
            "--prompt-format",
            help="Prompt format the answers came from: instruction, chat or text (default: what "
            "the data records; eval runs are instruction).",
        ),
    ] = None,
    cascade: Annotated[
        bool,
        typer.Option(
            "--cascade",
            help="Two eval runs over the same questions, SMALL then LARGE: the escalation "
            "threshold whose cascade accuracy >= --target-accuracy w.p. 1 - delta, and its curve.",
        ),
    ] = False,
    decisions: Annotated[
        bool,
        typer.Option(
            "--decisions",
            help="The inputs are labelled `gnll decide` outputs: per question type, P(correct) of "
            "the chosen option and the threshold whose accuracy >= --target-accuracy w.p. "
            "1 - delta (for gnll decide/serve --calibration).",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Fit a monotone map from an uncertainty measure to P(correct), with held-out metrics and thresholds."""
    from rich.console import Console

    if decisions:
        _calibrate_decisions(inputs, output, target_accuracy, delta, method, model, debug)
        return
    if cascade:
        from gnll.cli.calibrate_cascade import calibrate_cascade

        calibrate_cascade(inputs, output, plot, measure, correctness, target_accuracy, delta, debug)
        return

    from gnll.calibration import calibrate_files
    from gnll.calibration.plot import reliability_diagram

    console = Console(stderr=True)
    if not 0 < delta < 1:
        raise typer.BadParameter(f"--delta must be in (0, 1), got {delta}")
    try:
        cal, data = calibrate_files(
            [str(p) for p in inputs],
            measure=measure,
            correctness=correctness,
            model=model,
            prompt_format=prompt_format,
            method=method,
            cv=cv,
            bins=bins,
            delta=delta,
            target_accuracy=_opt_float(target_accuracy, "--target-accuracy"),
            target_coverage=_opt_float(target_coverage, "--target-coverage"),
        )
    except (FileNotFoundError, ValueError) as exc:
        if debug:
            raise
        console.print(f"[bold red]error:[/] {plain(exc)}", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    plot = plot or output.with_suffix(".reliability.png")
    m = cal.heldout_metrics
    reliability_diagram(
        cal.heldout_["p"],
        cal.heldout_["y"],
        plot,
        bins=bins,
        metrics=m,
        title=f"{cal.meta.get('model') or 'model'}: {measure} -> P(correct), {cal.method_}, held-out folds",
    )
    cal.meta["reliability_plot"] = plot.name
    if cal.meta.get("prompt_format") is None:
        console.print(
            "[yellow]warning:[/] the data does not say which prompt format its answers came from "
            "(instruction, chat or text): pass --prompt-format so the file can refuse answers "
            "from another one"
        )
    cal.save(output)
    _print_summary(console, cal, data, output, plot)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _print_summary(console, cal, data, output: Path, plot: Path) -> None:
    from rich.table import Table

    console.print(
        f"{len(data.scores)} labelled rows ({int(data.labels.sum())} correct)"
        + (f", {data.dropped} dropped (no score or no label)" if data.dropped else "")
        + f"; model {cal.meta.get('model')}"
    )
    cv = Table(title="Held-out (cross-validated) quality of P(correct)", show_edge=False)
    for col in ("method", "log-loss", "Brier", "ECE", "ECE (adaptive)", "AUROC"):
        cv.add_column(col, justify="right" if col != "method" else "left")
    for name, r in cal.cv_.items():
        mark = " (chosen)" if name == cal.method_ else ""
        cv.add_row(
            name + mark,
            _fmt(r["log_loss"]),
            _fmt(r["brier"]),
            _fmt(r["ece"]),
            _fmt(r["ece_adaptive"]),
            _fmt(r["auroc"]),
        )
    console.print(cv)
    m = cal.heldout_metrics
    console.print(
        f"[dim]ECE: {m['ece_binning']}; adaptive ECE: {m['ece_adaptive_binning']}; {m['folds']} folds[/]"
    )
    if cal.thresholds_:
        th = Table(title="Abstention thresholds (answer if score <= threshold)", show_edge=False)
        for col in ("target", "threshold", "coverage", "accuracy answered", "lower bound"):
            th.add_column(col, justify="right")
        for kind, t in cal.thresholds_.items():
            label = f"{kind} >= {t.target:g} (1-δ={1 - t.delta:g})"
            thr = (
                "abstain on all"
                if t.threshold == -math.inf
                else "answer all"
                if t.threshold == math.inf
                else f"{t.threshold:.4f}"
            )
            th.add_row(label, thr, _fmt(t.coverage), _fmt(t.accuracy), _fmt(t.accuracy_lower))
        console.print(th)
        rule, why = cal.to_dict()["default_rule"].values()
        console.print(f"default rule (--calibration without --rule): {rule}: {plain(why)}")
    console.print(f"[green]wrote[/] {plain(output)} and {plain(plot)}")


def _calibrate_decisions(
    inputs: list[Path],
    output: Path,
    target_accuracy: str,
    delta: float,
    method: str,
    model: str | None,
    debug: bool,
) -> None:
    """``gnll calibrate --decisions``: :class:`gnll.calibration.decisions.DecisionCalibration`."""
    from rich.console import Console

    from gnll.calibration.decisions import DecisionCalibration, labelled_decisions

    console = Console(stderr=True)
    target = _opt_float(target_accuracy, "--target-accuracy")
    if target is None or not 0 < target < 1 or not 0 < delta < 1:
        raise typer.BadParameter("--decisions needs --target-accuracy and --delta in (0, 1)")
    try:
        data, facts = labelled_decisions([str(p) for p in inputs])
        cal = DecisionCalibration(1 - target, delta, method=method).fit(data)
    except (FileNotFoundError, ValueError) as exc:
        if debug:
            raise
        console.print(f"[bold red]error:[/] {plain(exc)}", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    models = facts["models"]
    cal.meta.update(
        model=model or (models[0] if len(models) == 1 else None),
        data={
            "sources": [str(p) for p in inputs],
            "n": {k: int(len(s)) for k, (s, _) in data.items()},
            "n_correct": {k: int(y.sum()) for k, (_, y) in data.items()},
            "dropped": facts["dropped"],
        },
    )
    cal.save(output)
    for kind in cal.types:
        g = cal.guarantee(kind)
        assert g is not None
        console.print(f"{kind}: {plain(g['statement'])}", soft_wrap=True)
    console.print(f"[green]wrote[/] {plain(output)}")
