"""``gnll eval``: the paper's evaluation protocol (lm-evaluation-harness style options).

Example
-------
``gnll eval --model smollm2-135m-instruct --tasks triviaqa_short,svamp_short --limit 200
--output runs/demo`` writes ``samples.jsonl``, ``results.json``, ``table.md`` and ``plots/`` to
``runs/demo``; ``--measures g-nll`` skips beams, samples and clustering entirely.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gnll.cli._args import clusterer_kwargs, model_kwargs, parse_csv
from gnll.cli._errors import flagged, plain
from gnll.cli._ray import AddressOption, CpusOption, EngineOption, GpusOption, ReplicasOption

__all__ = ["evaluate"]


#: CLI parameter -> EvalConfig field, where the names differ (for preset overrides).
_CLI_TO_FIELD = {"bootstrap": "n_boot"}


def evaluate(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            rich_help_panel="Model and tasks",
            help="Model: embedded name, Hugging Face id or local path.",
        ),
    ] = ("smollm2-135m-instruct"),
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            rich_help_panel="Model and tasks",
            help="Comma-separated tasks: triviaqa_short, triviaqa_long, svamp_short, svamp_long, "
            "nq_open_short, nq_open_long; or all / short / long.",
        ),
    ] = "triviaqa_short,svamp_short,nq_open_short",
    output_path: Annotated[
        Path,
        typer.Option(
            "--output_path",
            "--output-path",
            rich_help_panel="Model and tasks",
            help="Run directory (created).",
        ),
    ] = Path("runs/eval"),
    model_args: Annotated[
        str | None,
        typer.Option(
            "--model_args",
            "--model-args",
            rich_help_panel="Model and tasks",
            help="key=value,... for the model loader (device, dtype, ...).",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            rich_help_panel="Model and tasks",
            help="Evaluate the first N questions of each evaluation pool.",
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data_dir",
            "--data-dir",
            rich_help_panel="Data",
            help="Folder with the full datasets (default: $GNLL_DATA_DIR; without either, the "
            "sample shipped with gnll).",
        ),
    ] = None,
    data_path: Annotated[
        str | None,
        typer.Option(
            "--data_path",
            "--data-path",
            rich_help_panel="Data",
            help="A single dataset file in its original format.",
        ),
    ] = None,
    data_source: Annotated[
        str,
        typer.Option(
            "--data_source",
            "--data-source",
            rich_help_panel="Data",
            help="'embedded' (the sample shipped with gnll: a few hundred questions per dataset), "
            "'local' (the full files: --data_dir, --data_path or $GNLL_DATA_DIR), 'hub' (Hugging "
            "Face datasets, needs network), 'reference' (the hub with Farquhar et al.'s TriviaQA "
            "split; the presets'), or 'auto': local when files are given, else embedded.",
        ),
    ] = "auto",
    split_path: Annotated[
        str | None,
        typer.Option(
            "--split_path",
            "--split-path",
            rich_help_panel="Data",
            help="File of evaluation-pool ids, one per line (e.g. a test split); the few-shot "
            "and held-out pools come from the other questions.",
        ),
    ] = None,
    pool_path: Annotated[
        str | None,
        typer.Option(
            "--pool_path",
            "--pool-path",
            rich_help_panel="Data",
            help="A second file of the dataset's format (e.g. NQ-Open train) for the few-shot and "
            "held-out pools; the whole data file is then evaluated.",
        ),
    ] = None,
    correctness: Annotated[
        str | None,
        typer.Option(
            "--correctness",
            rich_help_panel="Correctness",
            help="Comma-separated correctness metrics from f1, contains, judge; the first "
            "one picks the sampling temperature. Default: short tasks f1 (+judge), long tasks "
            "contains (judge first when --judge is given).",
        ),
    ] = None,
    judge: Annotated[
        str | None,
        typer.Option(
            "--judge",
            rich_help_panel="Correctness",
            help="Judge model(s), comma-separated: each is a correctness metric of its own "
            "(judge, judge2, ...) with rows labelled by judge.",
        ),
    ] = None,
    judge_args: Annotated[
        str | None,
        typer.Option(
            "--judge_args",
            "--judge-args",
            rich_help_panel="Correctness",
            help="key=value,... for the judge loader; with several judges, one set for all or "
            "one per judge separated by ';' (e.g. two vLLM servers).",
        ),
    ] = None,
    beams: Annotated[
        int,
        typer.Option(
            "--beams",
            rich_help_panel="Measures and sampling",
            help="Beam width K for BS-MSP (0 disables).",
        ),
    ] = 5,
    samples: Annotated[
        int,
        typer.Option(
            "--samples",
            rich_help_panel="Measures and sampling",
            help="Samples N for PE/SE/... (0 disables).",
        ),
    ] = 10,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature",
            rich_help_panel="Measures and sampling",
            help="Fix the sampling temperature (default: chosen from 0.5/1.0/1.5 on held-out).",
        ),
    ] = None,
    measures: Annotated[
        str,
        typer.Option(
            "--measures",
            rich_help_panel="Measures and sampling",
            help="Comma-separated measures (g-nll, ln-g-nll, bs-msp, pe, ln-pe, se, ln-se, "
            "d-se, mcp) or all; the variant g-nll+eos (LM-Polygraph's MSP: G-NLL with the "
            "terminator) only by name.",
        ),
    ] = "all",
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch_size",
            "--batch-size",
            rich_help_panel="Run",
            help="Sequences per forward pass (backend default if unset).",
        ),
    ] = None,
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk_size",
            "--chunk-size",
            rich_help_panel="Run",
            help="Questions per generate call and per cache flush (smaller: finer-grained resume).",
        ),
    ] = 256,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            rich_help_panel="Run",
            help="Seed of the data split, few-shot draw, sampling and bootstrap.",
        ),
    ] = 0,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            rich_help_panel="Run",
            help="Continue the run in --output, reusing its caches.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            rich_help_panel="Run",
            help="Delete an earlier run in --output and start over (without it, or --resume, "
            "an earlier run there is an error).",
        ),
    ] = False,
    clusterer: Annotated[
        str,
        typer.Option(
            "--clusterer",
            rich_help_panel="Measures and sampling",
            help="Semantic clusterer: auto (nli if available offline, else embedding), nli, "
            "embedding, exact, llm.",
        ),
    ] = "auto",
    clusterer_args: Annotated[
        str | None,
        typer.Option(
            "--clusterer_args",
            "--clusterer-args",
            rich_help_panel="Measures and sampling",
            help="key=value,... for the clusterer (model, threshold, ...).",
        ),
    ] = None,
    semantic_relation: Annotated[
        str | None,
        typer.Option(
            "--semantic_relation",
            "--semantic-relation",
            rich_help_panel="Measures and sampling",
            help="Entailment relation for nli/llm clustering: strict or loose.",
        ),
    ] = None,
    heldout_size: Annotated[
        int | None,
        typer.Option(
            "--heldout_size",
            "--heldout-size",
            rich_help_panel="Measures and sampling",
            help="Held-out questions for temperature selection (default: min(100, limit)).",
        ),
    ] = None,
    fewshot_as_multiturn: Annotated[
        bool,
        typer.Option(
            "--fewshot_as_multiturn",
            "--fewshot-as-multiturn",
            rich_help_panel="Data",
            help="Chat models: few-shot examples as user/assistant turns instead of one user turn.",
        ),
    ] = False,
    bootstrap: Annotated[
        int,
        typer.Option(
            "--bootstrap",
            rich_help_panel="Run",
            help="Bootstrap resamples for SEs and the significance test.",
        ),
    ] = 1000,
    f1_rule: Annotated[
        str,
        typer.Option(
            "--f1_rule",
            "--f1-rule",
            rich_help_panel="Correctness",
            help="F1 correctness: gt (F1 > 0.5, the paper's) or ge (>= 0.5, the reference code's).",
        ),
    ] = "gt",
    temperature_selection: Annotated[
        str,
        typer.Option(
            "--temperature_selection",
            "--temperature-selection",
            rich_help_panel="Measures and sampling",
            help="per-measure (each sampling measure its best held-out temperature, the paper's "
            "protocol) or shared (one per task, best mean AUROC of the paper's baselines).",
        ),
    ] = "per-measure",
    temperature_scope: Annotated[
        str,
        typer.Option(
            "--temperature_scope",
            "--temperature-scope",
            rich_help_panel="Measures and sampling",
            help="task (each task its own choice) or dataset (the short and long tasks of a "
            "dataset share one, on their pooled held-out AUROCs, as the paper; the presets' default).",
        ),
    ] = "task",
    sample_logprobs: Annotated[
        str,
        typer.Option(
            "--sample_logprobs",
            "--sample-logprobs",
            rich_help_panel="Measures and sampling",
            help="Log-probs of sampled answers for PE/SE/...: model (temperature 1) or sampling "
            "(the tempered distribution they were drawn from, as the reference code).",
        ),
    ] = "model",
    empty_answer: Annotated[
        str,
        typer.Option(
            "--empty_answer",
            "--empty-answer",
            rich_help_panel="Measures and sampling",
            help="Likelihood of an empty answer: terminator (its stop token's log-prob, as the "
            "reference code) or zero (log-likelihood 0).",
        ),
    ] = "terminator",
    reference: Annotated[
        str,
        typer.Option(
            "--reference",
            rich_help_panel="Correctness",
            help="The answer judged and scored by G-NLL: greedy (Table 1) or beam (the most "
            "likely of --beams K beams, the paper's Table 5).",
        ),
    ] = "greedy",
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", rich_help_panel="Run", help="Write PNG figures.")
    ] = True,
    progress: Annotated[
        bool,
        typer.Option("--progress/--no-progress", rich_help_panel="Run", help="Show progress bars."),
    ] = True,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset",
            rich_help_panel="Model and tasks",
            help="Run a paper grid (paper-table1, paper-table1-short, paper-table5, paper-llama-8b): one run per "
            "model under --output, merged table.md; options given here override the preset.",
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", rich_help_panel="Run", help="Log more.")
    ] = False,
    engine: EngineOption = "local",
    address: AddressOption = "auto",
    replicas: ReplicasOption = 1,
    cpus_per_replica: CpusOption = 1.0,
    gpus_per_replica: GpusOption = 0.0,
) -> None:
    """Evaluate uncertainty measures: how well they separate correct from incorrect answers."""
    from rich.console import Console
    from rich.logging import RichHandler
    from rich.text import Text

    from gnll.cli._errors import safe_text
    from gnll.evaluation.results.tables import render_table
    from gnll.evaluation.run.runner import Evaluator

    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        cfg = _config(ctx.params)
    except (KeyError, ValueError) as exc:  # ParameterError: named as its option
        fields_to_cli = {v: "--" + k for k, v in _CLI_TO_FIELD.items()}
        raise typer.BadParameter(flagged(exc, fields_to_cli)) from exc

    if engine not in ("local", "ray") or (engine == "ray" and preset is not None):
        raise typer.BadParameter(
            f"--engine must be local or ray (ray without --preset), got {engine}"
        )
    if preset is not None:
        _run_preset(ctx, preset, cfg, console, verbose)
        return
    t0 = time.perf_counter()
    if engine == "ray":
        from gnll.cli._ray import cluster_of
        from gnll.distributed.evaluation import RayEvaluator

        cluster = cluster_of(address, replicas, cpus_per_replica, gpus_per_replica)
        evaluator: Evaluator | RayEvaluator = RayEvaluator(cfg, cluster=cluster)  # local's outputs
    else:
        evaluator = Evaluator(cfg)
    results = evaluator.run()  # errors: one line from the CLI's error boundary (--debug: traceback)
    dt = time.perf_counter() - t0
    typer.echo(render_table([results], sections=("notes", "auroc")).rstrip())
    console.print(
        Text.assemble(
            ("\ndone", "green"),
            f" in {dt:.1f} s -> {safe_text(output_path)}/ "
            "(samples.jsonl, results.json, table.md, plots/)",
        )
    )
    if verbose:
        console.print({k: round(v, 2) for k, v in evaluator.timer.seconds.items()})


def _config(params: dict[str, Any]) -> Any:
    """The :class:`EvalConfig` of the command's options (each named as its field, but for
    ``_CLI_TO_FIELD``; the ones given as text parsed here). ``EvalConfig`` checks the values."""
    from gnll import measures as M
    from gnll.evaluation.data.tasks import parse_task_list
    from gnll.evaluation.run.config import EvalConfig

    names = {f.name for f in dataclasses.fields(EvalConfig)}
    fields = {_CLI_TO_FIELD.get(k, k): v for k, v in params.items()}
    fields = {k: v for k, v in fields.items() if k in names}
    fields.update(
        tasks=[t.name for t in parse_task_list(params["tasks"])],
        measures=M.validate(params["measures"]),
        model_args=model_kwargs(params["model_args"]),
        correctness=parse_csv(params["correctness"]),
        judge_args=_judge_kwargs(params["judge_args"]),
        clusterer_args=clusterer_kwargs(params["clusterer"], params["clusterer_args"]),
    )
    return EvalConfig(**fields)


def _judge_kwargs(spec: str | None) -> dict[str, Any] | list[dict[str, Any]]:
    """``--judge_args``: one key=value set for every judge, or one per judge split by ';'."""
    if spec is None or ";" not in spec:
        return model_kwargs(spec, "--judge_args")
    return [model_kwargs(part, "--judge_args") for part in spec.split(";")]


def _run_preset(ctx: typer.Context, preset: str, cfg: Any, console: Any, verbose: bool) -> None:
    from gnll.evaluation.run.presets import preset_configs, run_preset
    from gnll.evaluation.run.runner import FingerprintMismatchError

    given = {
        _CLI_TO_FIELD.get(k, k)
        for k in ctx.params
        # by name: typer may bundle its own click, whose enum is not click.core's
        if getattr(ctx.get_parameter_source(k), "name", "") == "COMMANDLINE"
    }
    models = parse_csv(cfg.model) if "model" in given else None
    try:
        configs = preset_configs(preset, cfg, given - {"model"}, models)
        path = run_preset(configs, cfg.output_path)
    except (KeyError, FileNotFoundError, FingerprintMismatchError, ImportError, ValueError) as exc:
        if verbose:
            raise
        console.print(f"[bold red]error:[/] {plain(str(exc).strip(chr(39)))}")
        raise typer.Exit(code=2) from exc
    console.print(f"[green]done[/]: {len(configs)} runs -> {plain(path)}")
