"""Options more than one command takes, declared once so that their spelling, type and help agree.

A command uses them as parameter annotations (``output: OutputOption``); its default stays in its
own signature, since a default is the command's choice (``--chunk_size`` is 256 rows for ``score``
and 64 for ``generate``, whose rows each cost a generation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "BeamsOption",
    "CalibrationOption",
    "ClustererArgsOption",
    "ClustererOption",
    "ChunkSizeOption",
    "ErrorsOption",
    "FormatOption",
    "LogprobsOption",
    "MaxNewTokensOption",
    "MeasuresOption",
    "ModelArgsOption",
    "ModelOption",
    "OutputFileOption",
    "OverwriteRowsOption",
    "ProgressOption",
    "PromptFormatOption",
    "ResumeRowsOption",
    "SamplesOption",
    "SeedOption",
    "TemperatureOption",
]

#: The model of every command that loads one.
ModelOption = Annotated[str, typer.Option("--model", help="Embedded name, hub id or local path.")]
ModelArgsOption = Annotated[
    str | None, typer.Option("--model_args", help="key=value,... for load_model")
]

# The file jobs (``score``, ``generate``): rows streamed from a file to a file, resumable.
InputFileOption = Annotated[
    str, typer.Option("--input", "-i", help="JSONL/CSV/Parquet file, or - for stdin (JSONL).")
]
OutputFileOption = Annotated[
    str, typer.Option("--output", "-o", help=".jsonl or .csv file, or - for stdout (JSONL).")
]
FormatOption = Annotated[
    str | None,
    typer.Option("--format", help="Input format: jsonl, csv or parquet (default: from the name)."),
]
ErrorsOption = Annotated[
    Path | None,
    typer.Option(
        "--errors",
        help="Errors file (default: the --output name + .errors.jsonl; stderr for stdout output).",
    ),
]
ResumeRowsOption = Annotated[
    bool,
    typer.Option("--resume", help="Continue a partly written --output without duplicating rows."),
]
OverwriteRowsOption = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Replace an earlier --output and its errors file (without it, or --resume, an "
        "existing output is an error).",
    ),
]
ChunkSizeOption = Annotated[
    int, typer.Option("--chunk_size", help="Rows read and written per step.")
]
ProgressOption = Annotated[
    bool, typer.Option("--progress/--no_progress", help="Progress bar (rows/s).")
]
CalibrationOption = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        help="calibration.json, or 'auto' (shipped for the model): adds p_correct, abstain.",
    ),
]
LogprobsOption = Annotated[
    bool, typer.Option("--logprobs", help="Add tokens and per-token log-probs.")
]

# What ``ask`` and ``generate`` compute for each question.
MeasuresOption = Annotated[
    str,
    typer.Option(
        "--measures",
        help="Comma-separated: g-nll, ln-g-nll, bs-msp, pe, ln-pe, se, ln-se, d-se, mcp.",
    ),
]
SamplesOption = Annotated[
    int, typer.Option("--samples", help="N samples for sampling-based measures.")
]
TemperatureOption = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
BeamsOption = Annotated[int, typer.Option("--beams", help="Beams for bs-msp.")]
ClustererOption = Annotated[
    str,
    typer.Option(
        "--clusterer",
        help="Semantic clusterer for se/ln-se/d-se/mcp: auto (nli if available offline, else "
        "embedding), nli, embedding, exact, llm.",
    ),
]
ClustererArgsOption = Annotated[
    str | None,
    typer.Option(
        "--clusterer_args", help="key=value,... for the clusterer (model, threshold, ...)."
    ),
]
MaxNewTokensOption = Annotated[
    int | None, typer.Option("--max_new_tokens", help="Default 50 (100 with --long).")
]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the sampled answers.")]
PromptFormatOption = Annotated[
    str,
    typer.Option(
        "--prompt_format",
        "--prompt-format",
        help="instruction: the question inside gnll's answer-briefly instruction; chat: the "
        "question alone as a chat message (as an OpenAI chat request sends it); text: the "
        "question as the exact text, no template.",
    ),
]
