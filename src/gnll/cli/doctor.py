"""``gnll doctor --base_url URL [--model NAME]``: is G-NLL from this server right?"""

from __future__ import annotations

from typing import Annotated

import typer

from gnll.cli._errors import plain

__all__ = ["doctor"]

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}


def doctor(
    base_url: Annotated[
        str,
        typer.Option(
            "--base_url", "--base-url", help="Server root with /v1, e.g. http://localhost:8000/v1."
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Served model name (default: the first one the server lists)."
        ),
    ] = None,
    server: Annotated[
        str,
        typer.Option(help="auto, vllm, llama-cpp-python, llama.cpp, openai, gnll or generic."),
    ] = "auto",
    chat: Annotated[
        bool | None,
        typer.Option("--chat/--no-chat", help="Chat template on (default: from the model name)."),
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="Requests for the speed check.")] = 16,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 4,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 60.0,
) -> None:
    """Probe an OpenAI-compatible server: raw log-probs, greedy decoding, terminator, chat template,
    determinism, speed. Exits 1 when G-NLL from this server would be wrong. The API key comes from
    GNLL_API_KEY or OPENAI_API_KEY."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gnll.backends.openai import HTTPClient, OpenAICompatModel, ServerError, ServerUnavailable
    from gnll.backends.openai.client import resolve_api_key
    from gnll.backends.openai.doctor import diagnose
    from gnll.cli._errors import safe_text

    console = Console()
    if model is None:
        client = HTTPClient(base_url, api_key=resolve_api_key(None), timeout=timeout, max_retries=1)
        try:
            listed = client.get("/models").get("data") or []
        except (ServerError, ServerUnavailable) as exc:
            typer.echo(f"error: {exc}{_v1_hint(base_url, exc)}", err=True)
            raise typer.Exit(code=1) from None
        finally:
            client.close()
        if not listed:
            typer.echo(f"error: {base_url}/models lists no model; pass --model", err=True)
            raise typer.Exit(code=1)
        model = str(listed[0].get("id"))
    try:
        target = OpenAICompatModel(
            model,
            base_url=base_url,
            server=server,
            chat=chat,
            timeout=timeout,
            max_retries=1,
            concurrency=concurrency,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    checks = diagnose(target, requests=requests, concurrency=concurrency)
    table = Table(title=f"gnll doctor: {model} at {base_url}", show_lines=True)
    for column in ("check", "verdict", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks:
        # Details quote server output (answers, error bodies): shown as text, never as markup.
        table.add_row(
            c.name,
            Text(c.verdict.upper(), style=_STYLE[c.verdict]),
            Text(safe_text(c.detail)),
            Text(safe_text(c.fix or ("nothing to fix" if c.verdict in ("pass", "info") else ""))),
        )
    console.print(table)
    failed = [c.name for c in checks if c.verdict == "fail"]
    if failed:
        console.print(
            f"[bold red]G-NLL from this server would be wrong:[/] {plain(', '.join(failed))}"
        )
        raise typer.Exit(code=1)
    console.print("[green]G-NLL from this server is the model's own.[/]")


def _v1_hint(base_url: str, exc: Exception) -> str:
    """What a 404 on ``/models`` most often means: the base URL lacks its ``/v1``.

    >>> _v1_hint("http://h:8000", RuntimeError("http://h:8000/models answered HTTP 404"))
    '; the OpenAI API is under /v1 on most servers: try --base_url http://h:8000/v1'
    """
    url = base_url.rstrip("/")
    if "404" in str(exc) and not url.endswith("/v1"):
        return f"; the OpenAI API is under /v1 on most servers: try --base_url {url}/v1"
    return ""
