"""``gnll serve``: an OpenAI-compatible server (or proxy) that adds G-NLL to every answer."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gnll._util.validation import ParameterError

if TYPE_CHECKING:
    from gnll.serving import AbstentionPolicy
    from gnll.serving.tracing import Emitter

__all__ = ["serve"]


def serve(
    model: Annotated[
        str, typer.Option("--model", help="Embedded name, hub id or local path (in-process mode).")
    ] = ("smollm2-135m-instruct"),
    model_args: Annotated[
        str | None,
        typer.Option("--model_args", "--model-args", help="key=value,... for load_model"),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            "--upstream", help="Proxy mode: an OpenAI-compatible server, http://HOST:PORT/v1."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            "--api_key",
            envvar="GNLL_API_KEY",
            show_default=False,
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY'.",
        ),
    ] = None,
    upstream_api_key: Annotated[
        str | None,
        typer.Option(
            "--upstream-api-key",
            envvar="GNLL_UPSTREAM_API_KEY",
            show_default=False,
            help="Bearer token sent to the upstream server.",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="annotate (the default), flag, refuse or escalate (the default with --cascade).",
            show_default=False,
        ),
    ] = None,
    escalate_to: Annotated[
        str | None,
        typer.Option(
            "--escalate-to",
            "--escalate_to",
            help="With --policy escalate: the larger model's OpenAI-compatible server, "
            "http://HOST:PORT/v1 (sent --upstream-api-key).",
        ),
    ] = None,
    escalate_model: Annotated[
        str | None,
        typer.Option(
            "--escalate-model",
            "--escalate_model",
            help="Model name sent to --escalate-to (default: its first listed model).",
        ),
    ] = None,
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            help="A `gnll calibrate` file, or 'auto' (the one shipped for an embedded model): "
            "p_correct and abstain; a `gnll calibrate --decisions` file calibrates /v1/decisions.",
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option("--threshold", help="Without --calibration: abstain when G-NLL > this."),
    ] = None,
    cascade: Annotated[
        Path | None,
        typer.Option(
            "--cascade",
            help="A `gnll calibrate --cascade` file (cascade.json): escalate when G-NLL is above "
            "its threshold (--policy escalate, with --escalate-to).",
        ),
    ] = None,
    cascade_any_format: Annotated[
        bool,
        typer.Option(
            "--cascade-any-format",
            help="Apply --cascade to chat requests although it was fitted on another prompt format "
            "(its guarantee then does not carry over).",
        ),
    ] = False,
    min_p_correct: Annotated[
        float | None,
        typer.Option(
            "--min_p_correct",
            "--min-p-correct",
            help="With --calibration: abstain below this p_correct.",
        ),
    ] = None,
    rule: Annotated[
        str | None,
        typer.Option(
            "--rule", help="With --calibration: the fitted threshold, accuracy or coverage."
        ),
    ] = None,
    refusal: Annotated[
        str | None, typer.Option("--refusal", help="Text that replaces refused answers.")
    ] = None,
    early: Annotated[
        bool | None,
        typer.Option(
            "--early/--no-early",
            help="Under --policy refuse/escalate, stop a local answer at the first token after "
            "which it is refused/escalated whatever follows (exact: the same decisions). "
            "Default: on when the policy allows it; with --upstream only for --policy escalate "
            "and an upstream that sends usage in streams (a cut answer has no usage).",
            show_default=False,
        ),
    ] = None,
    tool_argument_threshold: Annotated[
        float | None,
        typer.Option(
            "--tool-argument-threshold",
            "--tool_argument_threshold",
            help="Under --policy refuse/escalate, also withhold a tool call one of whose argument "
            "values has an NLL above this (in-process; the call's G-NLL is decided by the policy).",
            show_default=False,
        ),
    ] = None,
    prompt_format: Annotated[
        str,
        typer.Option(
            "--prompt-format",
            "--prompt_format",
            help="How chat requests are rendered: chat (the messages through the model's chat "
            "template) or instruction (one user message, a question asked as gnll ask asks it; "
            "in-process only). Completions prompts are always the exact text.",
        ),
    ] = "chat",
    max_request_bytes: Annotated[
        int, typer.Option("--max_request_bytes", "--max-request-bytes")
    ] = 1_000_000,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body_timeout",
            "--body-timeout",
            help="Seconds a request body may take to arrive (408 past it).",
        ),
    ] = 30.0,
    max_tokens_limit: Annotated[
        int | None,
        typer.Option(
            "--max_tokens_limit",
            "--max-tokens-limit",
            help="The most max_tokens a request may ask for (a 400 above). Default: 512 "
            "in-process; with --upstream the upstream's own limit.",
        ),
    ] = None,
    default_max_tokens: Annotated[
        int | None,
        typer.Option(
            "--default_max_tokens",
            "--default-max-tokens",
            help="max_tokens of a request that gives none (said in the X-Gnll-Default-Max-Tokens "
            "header). Default: 100 in-process; with --upstream the request goes upstream "
            "without one (the upstream's own default).",
        ),
    ] = None,
    max_batch_prompts: Annotated[
        int,
        typer.Option(
            "--max_batch_prompts", "--max-batch-prompts", help="Prompts per batched call."
        ),
    ] = 64,
    batch_wait_ms: Annotated[
        float,
        typer.Option(
            "--batch_wait_ms",
            "--batch-wait-ms",
            help="Longest wait for companions (adaptive: at most 5% of the last batch's time).",
        ),
    ] = 200.0,
    upstream_timeout: Annotated[
        float, typer.Option("--upstream_timeout", "--upstream-timeout")
    ] = 120.0,
    upstream_idle_timeout: Annotated[
        float,
        typer.Option(
            "--upstream_idle_timeout",
            "--upstream-idle-timeout",
            help="Seconds an upstream stream may send nothing once it has begun; past it the "
            "stream ends in an error event naming the upstream.",
        ),
    ] = 30.0,
    reasoning: Annotated[
        str | None,
        typer.Option(
            "--reasoning",
            help="The model reasons before it answers: think, harmony or marker:TEXT. G-NLL is "
            "the answer's, given the trace (in-process: greedy trace, then answer; --upstream: "
            "for a server without a reasoning parser; one with a parser is recognised anyway).",
        ),
    ] = None,
    log_prompts: Annotated[
        bool,
        typer.Option(
            "--log-prompts", "--log_prompts", help="Put prompt/answer text in the access log."
        ),
    ] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data_dir", "--data-dir", help="Example questions for the web page."),
    ] = None,
    otel: Annotated[
        bool,
        typer.Option(
            "--otel",
            help="Emit an OpenTelemetry gen_ai.evaluation.result event per score (needs the otel "
            "extra; OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, else stderr).",
        ),
    ] = False,
) -> None:
    """Serve /v1/completions and /v1/chat/completions with an `uncertainty` object on every answer."""
    from gnll.serving import ServeSettings, build_proxy_app, check_escalation
    from gnll.serving.server import configure_logging, listen, serve_forever

    with _option_errors():
        decisions_cal, calibration = _decisions_calibration(calibration)
        if reasoning is not None:
            from gnll.backends.reasoning import reasoning_format

            reasoning_format(reasoning)  # a typo fails here, before anything loads
        pol = _policy(
            policy,
            calibration,
            cascade,
            cascade_any_format,
            threshold,
            min_p_correct,
            rule,
            refusal,
            model_name=model,
            proxy=bool(upstream),
            prompt_format=prompt_format,
        )
        tracing, traced_to = _tracing() if otel else (None, None)
        settings = ServeSettings(
            api_key=api_key,
            max_request_bytes=max_request_bytes,
            body_timeout=body_timeout,
            default_max_tokens=default_max_tokens,
            max_tokens_limit=max_tokens_limit,
            log_prompts=log_prompts,
            policy=pol,
            data_dir=data_dir,
            upstream_timeout=upstream_timeout,
            upstream_idle_timeout=upstream_idle_timeout,
            prompt_format=prompt_format,
            tracing=tracing,
            early=early,
            decisions_calibration=decisions_cal,
            tool_argument_threshold=tool_argument_threshold,
        )
        check_escalation(settings, escalate_to, upstream=upstream)
        if upstream:
            application = build_proxy_app(
                upstream,
                settings,
                api_key=upstream_api_key,
                reasoning=reasoning,
                escalate_to=escalate_to,
                escalate_model=escalate_model,
            )
    try:
        sock = listen(host, port)  # before loading anything: a busy port fails at once
    except OSError as exc:
        typer.echo(f"gnll serve: {exc}", err=True)
        raise typer.Exit(1) from None
    configure_logging()
    if upstream:
        what = f"proxy to {upstream}" + (f", escalating to {escalate_to}" if escalate_to else "")
    else:
        application, name = _inprocess_app(
            model,
            model_args,
            reasoning,
            settings,
            max_batch_prompts=max_batch_prompts,
            max_wait_ms=batch_wait_ms,
            escalate_to=escalate_to,
            escalate_model=escalate_model,
            escalate_api_key=upstream_api_key,
        )
        what = f"{name} in-process" + (f", escalating to {escalate_to}" if escalate_to else "")
    _banner(what, f"http://{host}:{port}", settings, proxy=bool(upstream), traced_to=traced_to)
    serve_forever(application, host, port, sock=sock)


def _banner(what: str, url: str, settings: Any, *, proxy: bool, traced_to: str | None) -> None:
    """The start-up line: what is served where, and under which policy."""
    auth = "bearer auth on" if settings.api_key else "no auth"
    pol = settings.policy
    typer.echo(
        f"gnll serve: {what} on {url} ({auth}, chat prompts: {settings.prompt_format}, "
        f"policy {pol.mode}; {pol.source}" + _early_note(settings, proxy=proxy) + ")",
        err=True,
    )
    if traced_to:
        typer.echo(f"gnll serve: OpenTelemetry evaluation events to {traced_to}", err=True)


def _decisions_calibration(calibration: str | None) -> tuple[Any, str | None]:
    """``--calibration`` split by what it calibrates: ``(decisions calibration, None)`` for a
    ``/v1/decisions`` file, ``(None, calibration)`` for a G-NLL one (or none)."""
    if calibration is None or calibration == "auto":
        return None, calibration
    from gnll.calibration.decisions import DecisionCalibration, is_decisions_calibration

    if is_decisions_calibration(calibration):  # for /v1/decisions, not G-NLL answers
        return DecisionCalibration.load(calibration), None
    return None, calibration


def _inprocess_app(
    model: str, model_args: str | None, reasoning: str | None, settings: Any, **build: Any
) -> tuple[Any, str]:
    """The in-process app and its model's name. The policy checks a reasoning model's calibration
    before the model loads (its answers are scored after the end-of-reasoning marker)."""
    from gnll import load_model
    from gnll.cli._args import model_kwargs
    from gnll.serving import build_inprocess_app

    kwargs = model_kwargs(model_args, model=model)
    if reasoning is not None:
        kwargs["reasoning"] = reasoning
    if kwargs.get("reasoning"):
        with _option_errors():
            settings.policy.check_scored("answer")
    lm = load_model(model, **kwargs)
    with _option_errors():  # what the library refuses once the model is known
        application = build_inprocess_app(lm, settings, **build)
    return application, lm.name


#: The option of each library parameter an error may name (the others are ``--`` + the name).
FLAGS = {
    "mode": "--policy",
    "calibrator": "--calibration FILE",
    "threshold": "--threshold",
    "escalate_to": "--escalate-to",
    "prompt_format": "--prompt-format",
    "any_prompt_format": "--cascade-any-format",
    "upstream": "--upstream",
}


def _flagged(exc: Exception) -> str:
    """The message of a library error, with the parameters it names written as options."""
    names = [getattr(exc, "param", None), *getattr(exc, "others", ())]
    text = str(exc)
    for name in filter(None, names):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}\b", FLAGS.get(name, "--" + name), text)
    return text


@contextlib.contextmanager
def _option_errors() -> Iterator[None]:
    """Options the library refuses: one line naming the option, exit status 2."""
    try:
        yield
    except (ValueError, ImportError, FileNotFoundError) as exc:
        typer.echo(f"gnll serve: {_flagged(exc)}", err=True)
        raise typer.Exit(2) from None


def _early_note(settings: Any, *, proxy: bool) -> str:
    """The banner's word on early decisions (a proxy's default depends on its upstream)."""
    if settings.proxy_decides_early(streams_usage=False) if proxy else settings.decides_early:
        return "; early decisions"
    if proxy and settings.proxy_decides_early(streams_usage=True):
        return "; early decisions if the upstream sends usage in streams"
    return ""


def _policy(
    mode: str | None,
    calibration: str | None,
    cascade: Path | None,
    any_format: bool,
    threshold: float | None,
    min_p_correct: float | None,
    rule: str | None,
    refusal: str | None,
    *,
    model_name: str,
    proxy: bool,
    prompt_format: str,
) -> AbstentionPolicy:
    """The abstention policy the options ask for (the library checks the combination)."""
    from gnll.serving import AbstentionPolicy

    extra: dict[str, Any] = {"refusal": refusal} if refusal else {}
    if cascade is not None:
        if calibration is not None or threshold is not None:
            raise ParameterError(
                "cascade",
                "cannot be given with calibration or threshold (it is the threshold)",
                others=("calibration", "threshold"),
            )
        return _warned(
            AbstentionPolicy.from_cascade,
            cascade,
            mode=mode or "escalate",
            model=None if proxy else model_name,
            any_prompt_format=any_format,
            **extra,
        )
    if calibration is not None:
        if calibration == "auto" and proxy:
            raise ValueError(_proxy_auto(model_name))
        if calibration != "auto" and not Path(calibration).is_file():
            raise ValueError(f"--calibration {calibration} does not exist")
        if threshold is not None:
            raise ParameterError(
                "threshold",
                "cannot be given with calibration (give one of them)",
                others=("calibration",),
            )
        return _calibrated_policy(
            calibration,
            model=None if proxy else model_name,
            asks_like_ask=not proxy and prompt_format == "instruction",
            mode=mode or "annotate",
            min_p_correct=min_p_correct,
            rule=rule,
            **extra,
        )
    return AbstentionPolicy(
        mode=mode or "annotate",
        threshold=threshold,
        min_p_correct=min_p_correct,
        rule=rule,
        **extra,
    )


def _tracing() -> tuple[Emitter, str]:
    """The ``--otel`` emitter and where its events go."""
    try:
        from gnll.serving.tracing import Emitter, configure_provider

        where = configure_provider()
        return Emitter(), where
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"--otel needs OpenTelemetry ({exc.name} is missing): pip install 'gnll[otel]'"
        ) from None


def _proxy_auto(model: str) -> str:
    """Why ``--calibration auto`` cannot serve a proxy (the shipped files' prompts are not its)."""
    from gnll.calibration import SHIPPED

    shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.json"))) or "none"
    return (
        f"--calibration auto: the shipped calibrations (for {shipped}) were fitted on answers to "
        "gnll ask's instruction prompts, but a proxy serves chat requests, which the upstream "
        "renders with its chat template, so their P(correct) would not apply (whichever --model "
        f"you name, {model!r} included); fit one on chat answers "
        "(gnll calibrate FILE --prompt-format chat) and pass that file"
    )


def _calibrated_policy(spec: str, *, model: str | None, asks_like_ask: bool, **kwargs):
    """The policy of ``--calibration``; a file fitted on another model or prompt template is one
    warning line at start-up (the way ``gnll ask`` warns), before the server takes requests."""

    from gnll.backends.prompting import instruction_prompt
    from gnll.calibration import prompt_fingerprint
    from gnll.scoring.asking import ASK_PROMPTS
    from gnll.serving import AbstentionPolicy

    template = {}
    if asks_like_ask:  # chat requests are asked exactly as gnll ask asks them
        template = {
            "prompt_fingerprint": prompt_fingerprint(instruction_prompt("{question}")),
            "prompt_description": ASK_PROMPTS,
        }
    return _warned(AbstentionPolicy.from_calibration, spec, model=model, **template, **kwargs)


def _warned(make: Callable[..., AbstentionPolicy], *args: Any, **kwargs: Any) -> AbstentionPolicy:
    """``make(...)``, a file fitted on another model or prompt template said in one warning line
    at start-up (the way ``gnll ask`` warns), before the server takes requests."""
    import warnings

    from gnll.calibration import CalibrationMismatchWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationMismatchWarning)
        policy = make(*args, **kwargs)
    for w in caught:
        typer.echo(f"gnll serve: warning: {w.message}", err=True)
    return policy
