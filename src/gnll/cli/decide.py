"""``gnll decide``: typed decisions (predicate, choice, score) with exact option probabilities.

Example
-------
``gnll decide -i rows.jsonl -o decided.jsonl`` reads rows with ``input`` (text, or messages) and
``questions`` (in the OpenAI Decisions shape) and writes them back with ``answers``: every
option's exact probability among the options (its whole text teacher-forced), its NLL, the
options' mass, and a refusal's reason. ``--calibration`` (a ``gnll calibrate --decisions`` file)
adds each answer's P(correct) and its threshold's guarantee, and refuses answers below it.
Exit status: 0 if every row was decided, 1 if some rows failed (see the errors file), 2 on bad usage.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gnll.cli._errors import usage_failer
from gnll.cli._options import (
    ChunkSizeOption,
    ErrorsOption,
    FormatOption,
    InputFileOption,
    ModelArgsOption,
    ModelOption,
    OutputFileOption,
    OverwriteRowsOption,
    ProgressOption,
    ResumeRowsOption,
)
from gnll.cli.score import _report, check_files

__all__ = ["decide_command"]


def decide_command(
    input: InputFileOption,
    output: OutputFileOption,
    model: ModelOption = "smollm2-135m-instruct",
    model_args: ModelArgsOption = None,
    input_format: FormatOption = None,
    errors: ErrorsOption = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="A `gnll calibrate --decisions` file: p_correct, the guarantee, refusals below it.",
        ),
    ] = None,
    min_mass: Annotated[
        float,
        typer.Option(
            "--min-mass",
            "--min_mass",
            help="Refuse a question whose options cover less of the model's probability.",
        ),
    ] = 0.0,
    resume: ResumeRowsOption = False,
    overwrite: OverwriteRowsOption = False,
    chunk_size: ChunkSizeOption = 64,
    progress: ProgressOption = True,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Answer predicate, choice and score questions about each row's input, with exact probabilities."""
    from rich.console import Console

    from gnll.cli._args import model_kwargs

    console = Console(stderr=True)
    fail = usage_failer(console, debug)
    in_fmt, out_fmt, errors = check_files(
        fail, input, output, input_format, errors, resume, overwrite
    )
    if not 0.0 <= min_mass < 1.0:
        fail(f"--min-mass must be in [0, 1), got {min_mass}")
    hook = None
    if calibration is not None:
        from gnll.calibration.decisions import DecisionCalibration

        try:
            hook = DecisionCalibration.load(calibration).apply
        except ValueError as e:
            fail(str(e), e)
    from gnll._util.validation import ParameterError
    from gnll.scoring.stream import ScoreJob

    try:
        job = ScoreJob(
            input,
            output,
            in_fmt,
            out_fmt,
            errors,
            resume=resume,
            overwrite=overwrite,
            chunk_size=chunk_size,
            progress=progress,
        )
    except ParameterError as e:
        fail(f"--{e}", e)
    if debug:
        logging.basicConfig(level=logging.INFO)
    from gnll import load_model
    from gnll.scoring.decide_stream import run_decide_job

    try:
        lm = load_model(model, progress=progress, **model_kwargs(model_args, model=model))
    except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
        fail(f"cannot load model {model!r}: {e}", e)
    try:
        summary = run_decide_job(lm, job, min_mass=min_mass, hook=hook)
    except (FileNotFoundError, ValueError, ImportError) as e:
        fail(str(e), e)
    _report(console, summary)
