"""``gnll ask``: answer one question and say how uncertain the model is."""

from __future__ import annotations

import json
import math
from typing import Annotated

import typer

from gnll.cli._args import clusterer_kwargs, model_kwargs


def ask_prompt(question: str, *, long: bool) -> str:
    """The zero-shot prompt ``gnll ask`` sends: the evaluation's instruction, no few-shot block
    (the ``instruction`` prompt format, :func:`gnll.backends.prompting.instruction_prompt`)."""
    from gnll.backends.prompting import instruction_prompt

    return instruction_prompt(question, long=long)


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
    prompt_format: Annotated[
        str,
        typer.Option(
            "--prompt-format",
            "--prompt_format",
            help="instruction: the question inside gnll's answer-briefly instruction; chat: the "
            "question alone as a chat message (as an OpenAI chat request sends it); text: the "
            "question as the exact text, no template.",
        ),
    ] = "instruction",
    measures: Annotated[
        str,
        typer.Option(
            "--measures",
            help="Comma-separated: g-nll, ln-g-nll, bs-msp, pe, ln-pe, se, ln-se, d-se, mcp.",
        ),
    ] = "g-nll",
    samples: Annotated[
        int, typer.Option("--samples", help="N samples for sampling-based measures.")
    ] = 10,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature.")
    ] = 1.0,
    beams: Annotated[int, typer.Option("--beams", help="Beams for bs-msp.")] = 5,
    clusterer: Annotated[
        str,
        typer.Option(
            "--clusterer",
            help="Semantic clusterer for se/ln-se/d-se/mcp: auto (nli if available offline, else "
            "embedding), nli, embedding, exact, llm.",
        ),
    ] = "auto",
    clusterer_args: Annotated[
        str | None,
        typer.Option(
            "--clusterer_args",
            "--clusterer-args",
            help="key=value,... for the clusterer (model, threshold, ...).",
        ),
    ] = None,
    max_new_tokens: Annotated[
        int | None,
        typer.Option("--max_new_tokens", "--max-new-tokens", help="Default 50 (100 with --long)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
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
    from gnll import GenerationConfig, load_model
    from gnll import measures as M
    from gnll.backends.prompting import check_format, prompt_for

    try:
        wanted = M.validate(measures)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--measures") from exc
    try:
        fmt = check_format(prompt_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--prompt-format") from exc
    if "g-nll" not in wanted:
        wanted.insert(0, "g-nll")
    _check_options(samples=samples, beams=beams, temperature=temperature, max_new=max_new_tokens)
    options = model_kwargs(model_args)
    lm = load_model(model, progress=not as_json, **options)
    prompt, raw = prompt_for(question, fmt, long=long)
    cap = max_new_tokens if max_new_tokens is not None else (100 if long else 50)
    how = {"raw_prompt": True} if raw else {}
    [[greedy]] = lm.generate([prompt], GenerationConfig.greedy(max_new_tokens=cap), **how)

    needs = M.requirements(wanted)
    beam_gens = sample_gens = cluster_ids = None
    sample_texts: list[str] = []
    if M.Needs.BEAMS in needs:
        [beam_gens] = lm.generate([prompt], GenerationConfig.beam(beams, max_new_tokens=cap), **how)
    if M.Needs.SAMPLES in needs:
        cfg = GenerationConfig.sample(
            samples, temperature=temperature, max_new_tokens=cap, seed=seed
        )
        [sample_gens] = lm.generate([prompt], cfg, **how)
        sample_texts = [g.text for g in sample_gens]
    if M.Needs.CLUSTERS in needs:
        from gnll.semantic import load_clusterer

        options = clusterer_kwargs(clusterer, clusterer_args)
        cluster_ids = load_clusterer(clusterer, **options).cluster(question, sample_texts)
    values = M.compute(wanted, greedy, beam_gens, sample_gens, cluster_ids)
    calibrated = _calibrated(calibration, lm.name, long, fmt, values) if calibration else {}

    if as_json:
        record: dict[str, object] = {
            "question": question,
            "model": lm.name,
            "prompt_format": fmt,
            "answer": greedy.text,
            "tokens": greedy.tokens,
            "token_logprobs": greedy.token_logprobs,
            "finish_reason": greedy.finish_reason,
        }
        record.update({name.replace("-", "_"): value for name, value in values.items()})
        record.update(calibrated)
        if sample_gens is not None:
            record["samples"] = sample_texts
            record["sample_token_logprobs"] = [g.token_logprobs for g in sample_gens]
        if beam_gens is not None:
            record["beam_token_logprobs"] = [g.token_logprobs for g in beam_gens]
        if cluster_ids is not None:
            record["cluster_ids"] = list(cluster_ids)
        typer.echo(json.dumps(record, ensure_ascii=False))
        return
    _print_report(question, greedy, values, calibrated, fmt)


def _check_options(*, samples: int, beams: int, temperature: float, max_new: int | None) -> None:
    """Refuse impossible options before the model loads (not after the greedy pass)."""
    if samples < 1:
        raise typer.BadParameter(f"must be >= 1, got {samples}", param_hint="--samples")
    if beams < 1:
        raise typer.BadParameter(f"must be >= 1, got {beams}", param_hint="--beams")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise typer.BadParameter(
            f"must be a positive number, got {temperature} (temperature 0 is greedy decoding, "
            "whose answer G-NLL already scores)",
            param_hint="--temperature",
        )
    if max_new is not None and max_new < 1:
        raise typer.BadParameter(f"must be >= 1, got {max_new}", param_hint="--max_new_tokens")


def _calibrated(
    spec: str, model: str, long: bool, fmt: str, values: dict[str, float]
) -> dict[str, object]:
    """p_correct and abstain from a calibration file; a model/prompt mismatch is one warning line,
    a calibration fitted on another prompt format is refused."""
    import warnings

    from gnll.calibration import load_calibration, prompt_fingerprint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cal = load_calibration(
                spec,
                model=model,
                prompt_fingerprint=(
                    prompt_fingerprint(ask_prompt("{question}", long=long))
                    if fmt == "instruction"
                    else None
                ),
                prompt_format=fmt,
            )
        except (FileNotFoundError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--calibration") from exc
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    measure = cal.meta.get("measure", "g-nll")
    if measure not in values:
        raise typer.BadParameter(
            f"the calibration maps {measure!r}; add it to --measures", param_hint="--calibration"
        )
    out: dict[str, object] = {"p_correct": float(cal.predict_proba([values[measure]])[0])}
    if cal.thresholds_:
        out["abstain"] = bool(cal.abstain([values[measure]])[0])
    return out


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
    tokens = Table(title="Greedy answer tokens", show_edge=False)
    tokens.add_column("#", justify="right")
    tokens.add_column("token")
    tokens.add_column("log-prob", justify="right")
    tokens.add_column("prob", justify="right")
    for i, (tok, lp) in enumerate(zip(greedy.tokens, greedy.token_logprobs, strict=True)):
        tokens.add_row(str(i), Text(safe_text(repr(tok))), f"{lp:.4f}", f"{math.exp(lp):.3f}")
    console.print(tokens)
