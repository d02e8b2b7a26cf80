"""``gnll score``: NLL, ``is_greedy`` and (optionally) P(correct) of answers that already exist.

Example
-------
``gnll score --input answers.jsonl --output scored.jsonl --calibration calibration.json`` reads rows
with ``question`` (or ``prompt`` or chat ``messages``) and ``answer``, and writes them back with
``prompt_format`` (``instruction`` for a question, asked as ``gnll ask`` asks it; ``chat`` for
messages or a prompt; ``text`` for a prompt with ``--raw-prompt``), ``nll``, ``ln_nll``,
``num_tokens``, ``is_greedy``, ``greedy_stops``, ``p_correct`` and ``abstain``.
Exit status: 0 if every row was scored, 1 if some rows failed (see the errors file), 2 on bad usage.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gnll.cli._errors import plain, usage_failer
from gnll.cli._options import (
    CalibrationOption,
    ChunkSizeOption,
    ErrorsOption,
    FormatOption,
    InputFileOption,
    LogprobsOption,
    ModelArgsOption,
    ModelOption,
    OutputFileOption,
    OverwriteRowsOption,
    ProgressOption,
    ResumeRowsOption,
)
from gnll.cli._ray import AddressOption, CpusOption, EngineOption, GpusOption, ReplicasOption

__all__ = ["check_files", "score_command"]


def check_files(
    fail: Callable[..., None],
    input: str,
    output: str,
    input_format: str | None,
    errors: Path | None,
    resume: bool,
    overwrite: bool = False,
    required: tuple[tuple[str, ...], ...] = (),
) -> tuple[str, str, Path | None]:
    """The input and output formats and the errors file of a streaming job (``score``,
    ``generate``); calls ``fail(message)`` for an unusable combination, an input whose header lacks
    a ``required`` column, an output that would destroy data
    (:func:`~gnll.scoring.output.check_output`) or that ``--resume`` would continue from another
    input (:func:`~gnll.scoring.resume.check_same_input`), before the model loads."""
    from gnll._util.tabular import file_format
    from gnll.scoring.output import OutputExistsError, check_output
    from gnll.scoring.resume import check_same_input
    from gnll.scoring.rows import check_columns

    try:
        in_fmt = file_format(input, input_format)
    except ValueError as e:
        fail(str(e), e)
    try:
        out_fmt = file_format(output)
    except ValueError as e:
        fail(
            f"{output}: cannot tell the output format from its name; name it .jsonl or .csv "
            "(--format sets the input's format only)",
            e,
        )
    if input != "-" and not Path(input).is_file():
        fail(f"input file {input} does not exist")
    if out_fmt == "parquet":
        fail("output must be .jsonl or .csv (or - for stdout); Parquet output is not supported")
    if resume and output == "-":
        fail("--resume needs an output file, not stdout")
    if errors is None and output != "-":
        errors = Path(output + ".errors.jsonl")
    try:
        check_output(input, output, errors, out_fmt, resume=resume, overwrite=overwrite)
    except OutputExistsError as e:
        fail(str(e), e)
    try:
        check_columns(input, in_fmt, required)
    except ValueError as e:
        fail(str(e), e)
    if resume and output != "-":
        fields = [name for group in required for name in group]
        try:
            check_same_input(Path(output), out_fmt, input, in_fmt, fields)
        except OutputExistsError as e:
            fail(str(e), e)
    return in_fmt, out_fmt, errors


def score_command(
    input: InputFileOption,
    output: OutputFileOption,
    model: ModelOption = "smollm2-135m-instruct",
    model_args: ModelArgsOption = None,
    input_format: FormatOption = None,
    errors: ErrorsOption = None,
    raw_prompt: Annotated[
        bool,
        typer.Option(
            "--raw-prompt", help="'prompt' is the exact text the model sees (no chat template)."
        ),
    ] = False,
    verbatim: Annotated[
        bool,
        typer.Option(
            "--verbatim",
            help="Score answers exactly as given (default: a space goes back in front of an answer "
            "after a prompt that ends without one, as the model wrote it).",
        ),
    ] = False,
    long: Annotated[
        bool, typer.Option("--long", help="Render 'question' with gnll ask --long's instruction.")
    ] = False,
    logprobs: LogprobsOption = False,
    spans: Annotated[
        str | None,
        typer.Option(
            "--spans",
            help="Add the NLL of each sentence or JSON field value: sentence or json.",
        ),
    ] = None,
    with_greedy: Annotated[
        bool,
        typer.Option(
            "--with-greedy", help="Also generate the model's greedy answer and its G-NLL."
        ),
    ] = False,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens", help="Cap of --with_greedy answers (50; 100 with --long)."
        ),
    ] = None,
    calibration: CalibrationOption = None,
    resume: ResumeRowsOption = False,
    overwrite: OverwriteRowsOption = False,
    chunk_size: ChunkSizeOption = 256,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Rows per forward pass.")
    ] = None,
    progress: ProgressOption = True,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    engine: EngineOption = "local",
    address: AddressOption = "auto",
    replicas: ReplicasOption = 1,
    cpus_per_replica: CpusOption = 1.0,
    gpus_per_replica: GpusOption = 0.0,
) -> None:
    """Score given answers by teacher forcing (no generation, unless --with_greedy)."""
    from rich.console import Console

    from gnll.cli._args import model_kwargs

    console = Console(stderr=True)
    fail = usage_failer(console, debug)
    from gnll.scoring.rows import SCORE_COLUMNS

    in_fmt, out_fmt, errors = check_files(
        fail, input, output, input_format, errors, resume, overwrite, SCORE_COLUMNS
    )
    if engine not in ("local", "ray"):
        fail(f"--engine must be local or ray, got {engine!r}")
    # One job for either engine, built (and checked) before any model is loaded.
    job = _build_job(
        fail,
        console,
        model=model,
        calibration=calibration,
        input=input,
        output=output,
        input_format=in_fmt,
        output_format=out_fmt,
        errors=errors,
        long=long,
        raw_prompt=raw_prompt,
        verbatim=verbatim,
        logprobs=logprobs,
        with_greedy=with_greedy,
        spans=spans,
        max_new_tokens=max_new_tokens,
        resume=resume,
        overwrite=overwrite,
        chunk_size=chunk_size,
        batch_size=batch_size,
        progress=progress,
    )
    if debug:
        logging.basicConfig(level=logging.INFO)
    if engine == "ray":
        from gnll.cli._ray import cluster_of
        from gnll.distributed.scoring import run_score_job as run_on_ray

        cluster = cluster_of(address, replicas, cpus_per_replica, gpus_per_replica)
        args = model_kwargs(model_args)
        try:
            summary = run_on_ray(job, model, args, cluster)
        except (FileNotFoundError, ValueError, ImportError, RuntimeError) as e:
            fail(str(e), e)
    else:
        from gnll import load_model
        from gnll.scoring import run_score_job

        try:
            lm = load_model(model, progress=progress, **model_kwargs(model_args, model=model))
        except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
            fail(f"cannot load model {model!r}: {e}", e)
        try:
            summary = run_score_job(lm, job)
        except (FileNotFoundError, ValueError, ImportError) as e:
            fail(str(e), e)
    _report(console, summary)


def _build_job(fail: Callable[..., None], console: Any, **fields: Any) -> Any:
    """:func:`gnll.scoring.build_score_job`, its warnings printed and its errors one line."""
    from gnll._util.validation import ParameterError
    from gnll.scoring import build_score_job

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            job = build_score_job(**fields)
        except ParameterError as e:
            fail(f"--{e}", e)  # the parameter is the option of the same name
        except (FileNotFoundError, ValueError) as e:
            fail(str(e), e)
    for w in caught:
        console.print(f"[yellow]warning:[/] {plain(w.message)}")
    return job


def _report(console, summary) -> None:  # type: ignore[no-untyped-def]
    rate = summary.scored / summary.seconds if summary.seconds else 0.0
    msg = f"scored {summary.scored} rows in {summary.seconds:.1f} s ({rate:.1f} rows/s)"
    if summary.skipped_resume:
        msg += f"; {summary.skipped_resume} rows were already done (--resume)"
    if summary.boundary_merged:
        msg += f"; {summary.boundary_merged} with a token merged across the prompt/answer boundary"
    console.print(msg)
    for fmt, n in summary.uncalibrated.items():
        console.print(
            f"[yellow]warning:[/] {n} row(s) have no p_correct: their prompts are {fmt!r}, the "
            "calibration was fitted on answers to prompts of another format"
        )
    if summary.failed:
        where = summary.errors_path or "stderr"
        console.print(f"[bold red]{summary.failed} row(s) failed[/]: see {plain(where)}")
        raise typer.Exit(code=1)
