"""``gnll serve``: an OpenAI-compatible server (or proxy) that adds G-NLL to every answer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    port: Annotated[int, typer.Option("--port")] = 8000,
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
        str, typer.Option("--policy", help="annotate, flag, refuse or escalate.")
    ] = "annotate",
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
            "p_correct and abstain.",
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option("--threshold", help="Without --calibration: abstain when G-NLL > this."),
    ] = None,
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
            "Default: on when the policy allows it.",
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
        int, typer.Option("--max_tokens_limit", "--max-tokens-limit")
    ] = 512,
    default_max_tokens: Annotated[
        int, typer.Option("--default_max_tokens", "--default-max-tokens")
    ] = 100,
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
    from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app, create_app
    from gnll.serving.server import configure_logging, serve_forever

    try:
        if upstream and prompt_format != "chat":
            raise ValueError(
                "--prompt-format instruction needs an in-process --model: an --upstream server "
                "renders chat requests itself"
            )
        if reasoning is not None:
            from gnll.backends.reasoning import reasoning_format

            reasoning_format(reasoning)  # a typo fails here, before anything loads
        extra = {"refusal": refusal} if refusal else {}
        if calibration is not None:
            if calibration != "auto" and not Path(calibration).is_file():
                raise ValueError(f"--calibration {calibration} does not exist")
            if threshold is not None:
                raise ValueError("give --calibration or --threshold, not both")
            pol = AbstentionPolicy.from_calibration(
                calibration,
                model=None if upstream else model,
                mode=policy,
                min_p_correct=min_p_correct,
                rule=rule,
                **extra,
            )
        else:
            if min_p_correct is not None:
                raise ValueError(
                    "--min_p_correct needs --calibration (use --threshold on G-NLL without one)"
                )
            pol = AbstentionPolicy(mode=policy, threshold=threshold, **extra)
        if (pol.mode == "escalate") != (escalate_to is not None):
            raise ValueError("--policy escalate and --escalate-to URL go together")
        if escalate_to is not None and upstream:
            raise ValueError("--escalate-to needs a local --model, not --upstream")
        if escalate_to is not None and not escalate_to.startswith(("http://", "https://")):
            raise ValueError(
                f"--escalate-to must be an http(s) URL ending in /v1, got {escalate_to!r}"
            )
        if pol.mode != "annotate" and not pol.active:
            raise ValueError(f"--policy {pol.mode} needs --calibration FILE or --threshold G_NLL")
        useless = pol.refuses_everything() if pol.mode == "refuse" else None
        if useless:
            raise ValueError(
                f"--policy refuse would refuse every answer: {useless.strip()}; choose another "
                "--rule, --min_p_correct or --threshold"
            )
        tracing, traced_to = None, None
        if otel:
            from gnll.serving.tracing import Emitter, configure_provider

            try:
                traced_to = configure_provider()
                tracing = Emitter()
            except ModuleNotFoundError as exc:
                raise ImportError(
                    f"--otel needs OpenTelemetry ({exc.name} is missing): pip install 'gnll[otel]'"
                ) from None
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
            prompt_format=prompt_format,
            tracing=tracing,
            early=early,
        )
    except (ValueError, ImportError, FileNotFoundError) as exc:
        typer.echo(f"gnll serve: {exc}", err=True)
        raise typer.Exit(2) from None

    from gnll.serving.server import listen

    try:
        sock = listen(host, port)  # before loading anything: a busy port fails at once
    except OSError as exc:
        typer.echo(f"gnll serve: {exc}", err=True)
        raise typer.Exit(1) from None
    configure_logging()
    if upstream:
        from gnll.serving.proxy import ProxyService

        service = ProxyService(
            upstream, api_key=upstream_api_key, timeout=upstream_timeout, reasoning=reasoning
        )
        application = create_app(service, settings)
        what = f"proxy to {upstream}"
    else:
        from gnll import load_model
        from gnll.cli._args import model_kwargs

        kwargs = model_kwargs(model_args, model=model)
        if reasoning is not None:
            kwargs["reasoning"] = reasoning
        if pol.calibrator is not None and kwargs.get("reasoning"):
            from gnll.calibration import scored_mismatch

            # refused before the model loads: its answers are scored after the marker
            why = scored_mismatch(pol.calibrator, "answer")
            if why is not None:
                typer.echo(f"gnll serve: {why}", err=True)
                raise typer.Exit(2)
        lm = load_model(model, **kwargs)
        application = build_inprocess_app(
            lm,
            settings,
            max_batch_prompts=max_batch_prompts,
            max_wait_ms=batch_wait_ms,
            escalate_to=escalate_to,
            escalate_model=escalate_model,
            escalate_api_key=upstream_api_key,
        )
        what = f"{lm.name} in-process"
        if escalate_to:
            what += f", escalating to {escalate_to}"
    auth = "bearer auth on" if settings.api_key else "no auth"
    typer.echo(
        f"gnll serve: {what} on http://{host}:{port} ({auth}, chat prompts: {prompt_format}, "
        f"policy {pol.mode}; {pol.source}"
        + ("; early decisions" if settings.early and not upstream else "")
        + ")",
        err=True,
    )
    if traced_to:
        typer.echo(f"gnll serve: OpenTelemetry evaluation events to {traced_to}", err=True)
    serve_forever(application, host, port, sock=sock)
