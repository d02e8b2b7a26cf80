"""``gnll ask``: answer one question and say how uncertain the model is."""

from __future__ import annotations

import json
import math
from typing import Annotated

import typer

from gnll.cli.main import app

SHORT_INSTRUCTION = "Answer the following question as briefly as possible."
LONG_INSTRUCTION = "Answer the following question in a single brief but complete sentence."


def parse_model_args(text: str | None) -> dict[str, object]:
    """Parse lm-eval-harness style ``key=value,key=value`` into typed kwargs."""
    if not text:
        return {}
    out: dict[str, object] = {}
    for item in text.split(","):
        if "=" not in item:
            raise typer.BadParameter(f"expected key=value in --model_args, got {item!r}")
        key, value = (s.strip() for s in item.split("=", 1))
        low = value.lower()
        if low in {"true", "false"}:
            out[key] = low == "true"
        elif low in {"none", "null"}:
            out[key] = None
        else:
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    out[key] = value
    return out


def ask_prompt(question: str, *, long: bool) -> str:
    """The zero-shot prompt ``gnll ask`` sends (the paper's instruction and Question/Answer format)."""
    instruction = LONG_INSTRUCTION if long else SHORT_INSTRUCTION
    return f"{instruction}\nQuestion: {question}\nAnswer:"


@app.command("ask")
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
    max_new_tokens: Annotated[
        int | None,
        typer.Option("--max_new_tokens", "--max-new-tokens", help="Default 50 (100 with --long)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
) -> None:
    """Answer QUESTION greedily and report its G-NLL (and any other requested measures)."""
    from gnll import GenerationConfig, load_model
    from gnll import measures as M

    try:
        wanted = M.validate(measures)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--measures") from exc
    if "g-nll" not in wanted:
        wanted.insert(0, "g-nll")
    lm = load_model(model, progress=not as_json, **parse_model_args(model_args))
    prompt = ask_prompt(question, long=long)
    cap = max_new_tokens or (100 if long else 50)
    [[greedy]] = lm.generate([prompt], GenerationConfig.greedy(max_new_tokens=cap))

    needs = M.requirements(wanted)
    beam_gens = sample_gens = cluster_ids = None
    sample_texts: list[str] = []
    if M.Needs.BEAMS in needs:
        [beam_gens] = lm.generate([prompt], GenerationConfig.beam(beams, max_new_tokens=cap))
    if M.Needs.SAMPLES in needs:
        cfg = GenerationConfig.sample(
            samples, temperature=temperature, max_new_tokens=cap, seed=seed
        )
        [sample_gens] = lm.generate([prompt], cfg)
        sample_texts = [g.text for g in sample_gens]
    if M.Needs.CLUSTERS in needs:
        from gnll.semantic import load_clusterer

        cluster_ids = load_clusterer(clusterer).cluster(question, sample_texts)
    values = M.compute(wanted, greedy, beam_gens, sample_gens, cluster_ids)

    if as_json:
        record: dict[str, object] = {
            "question": question,
            "model": lm.name,
            "answer": greedy.text,
            "tokens": greedy.tokens,
            "token_logprobs": greedy.token_logprobs,
            "finish_reason": greedy.finish_reason,
        }
        record.update({name.replace("-", "_"): value for name, value in values.items()})
        if sample_gens is not None:
            record["samples"] = sample_texts
            record["sample_token_logprobs"] = [g.token_logprobs for g in sample_gens]
        if beam_gens is not None:
            record["beam_token_logprobs"] = [g.token_logprobs for g in beam_gens]
        if cluster_ids is not None:
            record["cluster_ids"] = list(cluster_ids)
        typer.echo(json.dumps(record, ensure_ascii=False))
        return
    _print_report(question, greedy, values)


def _print_report(question: str, greedy, values: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    from gnll import measures as M

    console = Console()
    console.print(f"[bold]Q:[/bold] {question}")
    console.print(f"[bold]A:[/bold] {greedy.text}  [dim]({greedy.finish_reason})[/dim]")
    scores = Table(title="Uncertainty", caption="higher = more uncertain", show_edge=False)
    scores.add_column("measure")
    scores.add_column("value", justify="right")
    for name, value in values.items():
        scores.add_row(M.get(name).label, f"{value:.4f}")
    console.print(scores)
    tokens = Table(title="Greedy answer tokens", show_edge=False)
    tokens.add_column("#", justify="right")
    tokens.add_column("token")
    tokens.add_column("log-prob", justify="right")
    tokens.add_column("prob", justify="right")
    for i, (tok, lp) in enumerate(zip(greedy.tokens, greedy.token_logprobs, strict=True)):
        tokens.add_row(str(i), repr(tok), f"{lp:.4f}", f"{math.exp(lp):.3f}")
    console.print(tokens)
