"""``gnll generate``: greedy answers and their G-NLL for a file of questions.

Example
-------
``gnll generate --input questions.jsonl --output answers.jsonl --calibration auto`` reads rows with a
``question`` field and writes them back with ``answer``, ``g_nll`` (and any other ``--measures``),
``num_tokens``, ``finish_reason``, ``p_correct`` and ``abstain``. Every answer is the one ``gnll ask``
gives for that question. Exit status: 0 if every row was answered, 1 if some rows failed (see the
errors file), 2 on bad usage. ``--policy refuse`` (``--threshold`` or ``--calibration``) writes the
refusal instead of the answers that policy abstains on, and stops them at the token where the
refusal became certain (``--early``, on when exact).

Why a command of its own rather than ``gnll ask --input``: ``ask`` prints a report for one question
at a terminal, while this is a streaming file job with ``gnll score``'s options (``--input``,
``--output``, ``--format``, ``--errors``, ``--resume``, ``--chunk_size``) and exit codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gnll.cli._errors import plain, usage_failer
from gnll.cli._options import (
    BeamsOption,
    CalibrationOption,
    ChunkSizeOption,
    ClustererArgsOption,
    ClustererOption,
    ErrorsOption,
    FormatOption,
    LogprobsOption,
    MaxNewTokensOption,
    MeasuresOption,
    ModelArgsOption,
    ModelOption,
    OutputFileOption,
    OverwriteRowsOption,
    ProgressOption,
    PromptFormatOption,
    ResumeRowsOption,
    SamplesOption,
    SeedOption,
    TemperatureOption,
)

__all__ = ["generate"]

if TYPE_CHECKING:
    from gnll.policy import AbstentionPolicy


def generate(
    input: Annotated[
        str,
        typer.Option(
            "--input", "-i", help="JSONL/CSV/Parquet file with a 'question' field, or - (JSONL)."
        ),
    ],
    output: OutputFileOption,
    model: ModelOption = "smollm2-135m-instruct",
    model_args: ModelArgsOption = None,
    input_format: FormatOption = None,
    errors: ErrorsOption = None,
    long: Annotated[bool, typer.Option("--long", help="Ask for one-sentence answers.")] = False,
    prompt_format: PromptFormatOption = "instruction",
    measures: MeasuresOption = "g-nll",
    samples: SamplesOption = 10,
    temperature: TemperatureOption = 1.0,
    beams: BeamsOption = 5,
    clusterer: ClustererOption = "auto",
    clusterer_args: ClustererArgsOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    seed: SeedOption = 0,
    calibration: CalibrationOption = None,
    logprobs: LogprobsOption = False,
    resume: ResumeRowsOption = False,
    overwrite: OverwriteRowsOption = False,
    chunk_size: ChunkSizeOption = 64,
    progress: ProgressOption = True,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="refuse: write the refusal instead of the answers the policy abstains on "
            "(decided as gnll serve --policy refuse decides: --threshold or --calibration).",
            show_default=False,
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold", help="With --policy refuse, without --calibration: refuse G-NLL > this."
        ),
    ] = None,
    refusal: Annotated[
        str | None,
        typer.Option("--refusal", help="With --policy refuse: the text written instead."),
    ] = None,
    early: Annotated[
        bool | None,
        typer.Option(
            "--early/--no-early",
            help="With --policy refuse: stop an answer at the first token after which it is "
            "refused whatever follows (exact: the same decisions). Default: on when the policy, "
            "the model and --measures g-nll allow it.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Answer every question of a file greedily, with its G-NLL (and P(correct))."""
    from rich.console import Console

    from gnll import load_model
    from gnll import measures as M
    from gnll.backends.prompting import check_format
    from gnll.cli._args import clusterer_kwargs, model_kwargs
    from gnll.cli.ask import _calibration
    from gnll.cli.score import check_files
    from gnll.scoring.asking import AskOptionError, check_ask_options
    from gnll.scoring.generating import AskOptions, run_generate_job
    from gnll.scoring.stream import build_score_job

    console = Console(stderr=True)

    fail = usage_failer(console)

    if chunk_size < 1:
        fail(f"--chunk_size must be >= 1, got {chunk_size}")
    try:
        wanted = M.validate(measures)
        check_ask_options(
            samples=samples, beams=beams, temperature=temperature, max_new_tokens=max_new_tokens
        )
    except AskOptionError as exc:
        fail(f"--{exc.option} {exc.reason}", exc)
    except ValueError as exc:
        fail(f"--measures: {exc}", exc)
    try:
        fmt = check_format(prompt_format)
    except ValueError as exc:
        fail(f"--prompt_format: {exc}", exc)
    ask_policy = any(x is not None for x in (policy, threshold, refusal, early))
    if ask_policy:  # checked before the model loads
        _check_policy(fail, policy, threshold, calibration, refusal)
    in_fmt, out_fmt, errors = check_files(
        fail, input, output, input_format, errors, resume, overwrite, (("question",),)
    )
    typer.echo(f"loading {model} ...", err=True)
    lm = load_model(model, progress=progress, **model_kwargs(model_args, model=model))
    cal = _calibration(calibration, lm.name, long, wanted, fmt) if calibration else None
    pol = _refuse_policy(fail, cal, threshold, refusal) if ask_policy else None
    watched = _early_model(fail, lm, pol, wanted, fmt, early) if pol is not None else None
    clusterer_obj: object = clusterer
    if M.Needs.CLUSTERS in M.requirements(wanted):  # load it once, not once per row
        from gnll.semantic import load_clusterer

        clusterer_obj = load_clusterer(clusterer, **clusterer_kwargs(clusterer, clusterer_args))
    # the one job site of gnll score (its checks and defaults); the calibration is the answers'
    job = build_score_job(
        input=input,
        output=output,
        input_format=in_fmt,
        output_format=out_fmt,
        errors=errors,
        long=long,
        resume=resume,
        overwrite=overwrite,
        chunk_size=chunk_size,
        progress=progress,
    )
    opts = AskOptions(
        measures=wanted,
        long=long,
        samples=samples,
        temperature=temperature,
        beams=beams,
        clusterer=clusterer_obj,
        max_new_tokens=max_new_tokens,
        seed=seed,
        calibration=cal,
        logprobs=logprobs,
        prompt_format=fmt,
        policy=pol,
    )
    _report(console, run_generate_job(lm if watched is None else watched, job, opts))


def _report(console: Any, summary: Any) -> None:
    """What a finished job did; exit status 1 when a row failed."""
    rate = summary.scored / summary.seconds if summary.seconds else 0.0
    msg = f"answered {summary.scored} questions in {summary.seconds:.1f} s ({rate:.2f}/s)"
    if summary.skipped_resume:
        msg += f"; {summary.skipped_resume} rows were already done (--resume)"
    console.print(msg)
    if summary.failed:
        where = summary.errors_path or "stderr"
        console.print(f"[bold red]{summary.failed} row(s) failed[/]: see {plain(where)}")
        raise typer.Exit(code=1)


def _check_policy(
    fail: Callable[..., Any],
    mode: str | None,
    threshold: float | None,
    calibration: str | None,
    refusal: str | None,
) -> None:
    """The ``--policy`` options, checked before the model loads: ``gnll generate`` takes ``--policy
    refuse``; the rest are the policy's own rules (:class:`gnll.policy.AbstentionPolicy`)."""
    if mode != "refuse":
        what = f"--policy {mode}" if mode else "--threshold/--refusal/--early without --policy"
        fail(f"{what}: gnll generate takes --policy refuse (with --threshold or --calibration)")
    from gnll.policy import AbstentionPolicy

    if calibration is None:  # the whole policy, built as it will be
        _refuse_policy(fail, None, threshold, refusal)
    else:
        _policy_error(fail, AbstentionPolicy.check_rule, mode, calibrated=True, threshold=threshold)


def _policy_error(
    fail: Callable[..., Any], check: Callable[..., Any], *args: Any, **kw: Any
) -> Any:
    """``check(*args, **kw)``, a policy's error said in one line naming the options."""
    from gnll.cli.serve import _flagged

    try:
        return check(*args, **kw)
    except ValueError as exc:  # ParameterError included: one line naming the option
        fail(_flagged(exc), exc)


def _refuse_policy(
    fail: Callable[..., Any], calibrator: Any, threshold: float | None, refusal: str | None
) -> AbstentionPolicy:
    """``--policy refuse``: the library's :class:`gnll.policy.AbstentionPolicy` (the validation
    and the decisions of ``gnll serve --policy refuse``)."""
    from gnll.policy import AbstentionPolicy

    extra: dict[str, Any] = {"refusal": refusal} if refusal else {}
    return _policy_error(
        fail, AbstentionPolicy, mode="refuse", calibrator=calibrator, threshold=threshold, **extra
    )


def _early_model(
    fail: Callable[..., Any], lm: Any, pol: Any, wanted: list[str], fmt: str, early: bool | None
) -> Any:
    """The model that stops refused answers early (:func:`gnll.scoring.generating.early_greedy`) when the
    policy, the model and the measures allow it; ``None`` otherwise, and with ``--early`` asked
    for, one line saying why not."""
    from gnll.cli.serve import _flagged
    from gnll.measures.early import EarlyDecisionError
    from gnll.scoring.generating import early_greedy

    if early is False:
        return None
    try:
        return early_greedy(lm, pol, measures=wanted, prompt_format=fmt)
    except EarlyDecisionError as exc:
        if early:
            fail(f"--early: {_flagged(exc)}")
        return None
