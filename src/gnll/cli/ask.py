"""``gnll ask``: answer one question and say how uncertain the model is."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer

from gnll.cli._args import clusterer_kwargs, model_kwargs
from gnll.cli._options import (
    BeamsOption,
    ClustererArgsOption,
    ClustererOption,
    MaxNewTokensOption,
    MeasuresOption,
    PromptFormatOption,
    SamplesOption,
    SeedOption,
    TemperatureOption,
)


def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    model: Annotated[str, typer.Option("--model", help="Embedded name, hub id or local path.")] = (
        "smollm2-135m-instruct"
    ),
    model_args: Annotated[
        str | None,
        typer.Option("--model_args", "--model-args", help="key=value,... for load_model"),
    ] = None,
    long: Annotated[bool, typer.Option("--long", help="Ask for a one-sentence answer.")] = False,
    prompt_format: PromptFormatOption = "instruction",
    measures: MeasuresOption = "g-nll",
    samples: SamplesOption = 10,
    temperature: TemperatureOption = 1.0,
    beams: BeamsOption = 5,
    clusterer: ClustererOption = "auto",
    clusterer_args: ClustererArgsOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    seed: SeedOption = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
    spans: Annotated[
        str | None,
        typer.Option(
            "--spans", help="Also the NLL of each sentence or JSON field: sentence or json."
        ),
    ] = None,
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            help="calibration.json from gnll calibrate, or 'auto' (the file shipped for the "
            "model): adds p_correct and the abstention decision.",
        ),
    ] = None,
) -> None:
    """Answer QUESTION greedily and report its G-NLL (and any other requested measures)."""
    from gnll import load_model
    from gnll import measures as M
    from gnll.backends.prompting import check_format
    from gnll.scoring.asking import AskOptionError, ask, check_ask_options, check_question

    try:
        check_question(question)
    except ValueError as exc:  # before the model loads; one line, like gnll generate's empty row
        from rich.console import Console

        from gnll.cli._errors import usage_failer

        usage_failer(Console(stderr=True))(
            f'{exc}: ask something, e.g. gnll ask "What is the capital of France?"'
        )
    try:
        wanted = M.validate(measures)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--measures") from exc
    try:
        fmt = check_format(prompt_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--prompt-format") from exc
    try:  # before the model loads, not after the greedy pass
        check_ask_options(
            samples=samples,
            beams=beams,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            spans=spans,
        )
    except AskOptionError as exc:
        raise typer.BadParameter(exc.reason, param_hint=f"--{exc.option}") from exc
    typer.echo(f"loading {model} ...", err=True)  # stderr: --json output stays one object
    lm = load_model(model, progress=not as_json, **model_kwargs(model_args, model=model))
    cal = _calibration(calibration, lm.name, long, wanted, fmt) if calibration else None
    from gnll.backends.base import ContextOverflow

    try:
        result = ask(
            lm,
            question,
            wanted,
            long=long,
            samples=samples,
            temperature=temperature,
            beams=beams,
            clusterer=clusterer,
            clusterer_args=clusterer_kwargs(clusterer, clusterer_args),
            max_new_tokens=max_new_tokens,
            seed=seed,
            calibration=cal,
            prompt_format=fmt,
            spans=spans,
        )
    except ContextOverflow as exc:
        from rich.console import Console

        from gnll.cli._errors import usage_failer

        usage_failer(Console(stderr=True))(exc.for_question())
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        return
    _print_report(question, result.greedy, result.measures, result.calibrated(), fmt)
    if result.spans is not None:
        _print_spans(result.spans, len(result.greedy.tokens))


def _print_spans(report: dict, num_tokens: int) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gnll.cli._errors import safe_text

    console = Console()
    if report["spans"] is None:
        console.print(f"[yellow]spans:[/] {report['spans_error']}")
        return
    unassigned = num_tokens - sum(s["num_tokens"] for s in report["spans"])
    table = Table(
        title=f"NLL per {'JSON field' if report['spans_kind'] == 'json' else 'sentence'}",
        caption=f"not in any span: {report['unassigned_nll']:.4f} ({unassigned} "
        "tokens); * least certain",
        show_edge=False,
    )
    for col in ("span", "text", "NLL", "tokens"):
        table.add_column(col, justify="right" if col in ("NLL", "tokens") else "left")
    for s in report["spans"]:
        mark = " *" if s["path"] == report["least_certain_span"] else ""
        table.add_row(
            s["path"] + mark, Text(safe_text(s["text"])), f"{s['nll']:.4f}", str(s["num_tokens"])
        )
    console.print(table)


def _calibration(spec: str, model: str, long: bool, measures: list[str], fmt: str) -> Any:
    """The calibration for ``--calibration``; a model/prompt mismatch is one warning line, one
    fitted on another prompt format is refused."""
    import warnings

    from gnll.scoring.asking import ask_calibration

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cal = ask_calibration(
                spec, model=model, long=long, measures=measures, prompt_format=fmt
            )
        except (FileNotFoundError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--calibration") from exc
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    return cal


def _print_report(
    question: str,
    greedy,
    values: dict[str, float],
    calibrated: dict[str, object] | None = None,
    fmt: str = "instruction",
) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gnll import measures as M
    from gnll.cli._errors import safe_text

    console = Console()
    # Question, answer and tokens are untrusted text: rich Text (never markup) with terminal
    # control characters escaped.
    console.print(Text.assemble(("Q: ", "bold"), safe_text(question)))
    console.print(
        Text.assemble(
            ("A: ", "bold"), safe_text(greedy.text), (f"  ({greedy.finish_reason})", "dim")
        )
    )
    caption = f"higher = more uncertain; prompt format: {fmt}"
    scores = Table(title="Uncertainty", caption=caption, show_edge=False)
    scores.add_column("measure")
    scores.add_column("value", justify="right")
    for name, value in values.items():
        scores.add_row(M.get(name).label, f"{value:.4f}")
    console.print(scores)
    if calibrated:
        line = f"[bold]P(correct):[/bold] {calibrated['p_correct']:.3f}"
        if "abstain" in calibrated:
            line += "  -> " + (
                "[red]abstain[/red]" if calibrated["abstain"] else "[green]answer[/green]"
            )
        console.print(line)
    if not greedy.tokens:
        console.print(
            f"[dim]empty answer: scored by the log-prob of the token that ended it, "
            f"{greedy.measured_logprobs[0]:.4f}[/dim]"
        )
        return
    tokens = Table(title="Greedy answer tokens", show_edge=False)
    tokens.add_column("#", justify="right")
    tokens.add_column("token")
    tokens.add_column("log-prob", justify="right")
    tokens.add_column("prob", justify="right")
    for i, (tok, lp) in enumerate(zip(greedy.tokens, greedy.token_logprobs, strict=True)):
        tokens.add_row(str(i), Text(safe_text(repr(tok))), f"{lp:.4f}", f"{math.exp(lp):.3f}")
    console.print(tokens)
