"""The CLI's one error boundary, and printing untrusted text safely.

Every command is registered through :func:`error_boundary` (see ``cli/main.py``), which adds a
``--debug`` option and turns any exception into one line on stderr saying what failed and what to
do, with exit status 2 for a user error (bad option, data, file, configuration) and 1 for a
failure (out of memory, network, a bug); ``--debug`` (or ``GNLL_DEBUG=1``) prints the traceback
instead, without local variables. Secret option values (``api_key=...``) and the API keys in the
environment are blanked in both.

Text from questions, answers, files and exceptions is printed as text: never parsed as rich markup
(``[/b]`` is just characters) and with terminal control characters shown as escapes
(:func:`safe_text`), so a hostile answer cannot move the cursor, recolour or retitle the terminal.

>>> safe_text("ok\\x1b[2J\\x07 [/b]")
'ok\\\\x1b[2J\\\\x07 [/b]'
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Annotated, Any, NoReturn

import click
import typer

try:  # typer >= 0.16 vendors its own click
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:  # pragma: no cover - older typer uses click itself
    _TyperClickException = click.ClickException

__all__ = ["error_boundary", "plain", "safe_text", "scrub"]

EXIT_USER = 2
EXIT_FAILURE = 1
ENV_KEYS = ("OPENAI_API_KEY", "GNLL_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

# C0 and C1 control characters (but newline and tab), DEL, and the bidirectional overrides that
# can make a line display differently from what it contains.
_UNSAFE = [c for c in range(0x20) if c not in (0x09, 0x0A)] + list(range(0x7F, 0xA0))
_UNSAFE += [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _UNSAFE}


def safe_text(text: Any) -> str:
    """``str(text)`` with terminal control characters replaced by visible escapes."""
    return str(text).translate(_ESCAPES)


def plain(text: Any) -> str:
    """:func:`safe_text` escaped for a rich markup string: ``f"[red]error:[/] {plain(msg)}"``."""
    from rich.markup import escape

    return escape(safe_text(text))


def usage_failer(console: Any, debug: bool = False) -> Callable[..., NoReturn]:
    """``fail(message, exc=None)``: print ``error: message`` on ``console`` and exit with status 2
    (bad usage or input); with ``debug``, raise ``exc`` instead so its traceback shows."""

    def fail(message: str, exc: BaseException | None = None) -> NoReturn:
        if debug and exc is not None:
            raise exc
        console.print(f"[bold red]error:[/] {plain(message)}", soft_wrap=True)
        raise typer.Exit(code=2)

    return fail


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every (non-trivial) secret value replaced by ``<redacted>``."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


def _secret_values(kwargs: dict[str, Any]) -> list[str]:
    from gnll.backends.identity import is_secret

    values = [os.environ.get(k, "") for k in ENV_KEYS]
    for name, value in kwargs.items():
        if not isinstance(value, str) or not name.endswith("_args"):
            continue
        for part in value.split(","):
            key, sep, val = part.partition("=")
            if sep and is_secret(key.strip()):
                values.append(val.strip())
    return values


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch else None
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ValueError, LookupError, OSError, ImportError]
    for module, names in (
        ("gnll.evaluation.run.store", ("FingerprintMismatchError", "EarlierRunError")),
        ("gnll.evaluation.run.runner", ("FingerprintMismatchError",)),
        ("gnll.evaluation.run.rundir", ("RunDirectoryBusyError", "ForeignFilesError")),
    ):
        mod = sys.modules.get(module)
        types += [getattr(mod, n) for n in names if mod is not None and hasattr(mod, n)]
    return tuple(types)


#: OSErrors that are the machine's fault, not the user's input.
_FAILURE_ERRNOS = {28, 5, 122}  # ENOSPC, EIO, EDQUOT


def classify(exc: BaseException, resumable: bool = False) -> tuple[int, str]:
    """(exit status, what to do) for an exception that reached the boundary.

    ``resumable``: the command takes ``--resume`` (eval, score, generate), so "rerun" says to
    rerun with it. No hint when the error's own message already says what to do (gnll's own
    network errors do), so a user never reads two different "what to do"s.
    """
    rerun = "rerun with --resume (finished work is kept)" if resumable else "rerun"
    if _is_oom(exc):
        return EXIT_FAILURE, (
            f"out of memory: lower --batch_size, or max_batch_tokens in --model_args, then {rerun}"
        )
    if isinstance(exc, OSError) and exc.errno in _FAILURE_ERRNOS:
        return EXIT_FAILURE, f"free disk space (or fix the disk), then {rerun}"
    if isinstance(exc, _advised()):
        return EXIT_FAILURE, ""
    if type(exc).__module__.startswith(("httpx", "httpcore", "urllib3", "requests")):
        return EXIT_FAILURE, f"check that the server is running and reachable, then {rerun}"
    if isinstance(exc, TimeoutError | ConnectionError):
        return EXIT_FAILURE, f"check that the server is running and reachable, then {rerun}"
    if isinstance(exc, TypeError) and "keyword argument" in str(exc):
        return EXIT_USER, "check the key names in --model_args / --judge_args / --clusterer_args"
    if isinstance(exc, OverflowError | click.BadParameter):
        return EXIT_USER, ""
    if isinstance(exc, _user_error_types()):
        return EXIT_USER, ""
    return EXIT_FAILURE, "this looks like a bug: rerun with --debug and report the traceback"


def _advised() -> tuple[type[BaseException], ...]:
    """Network errors whose message says what to do (no server involved for the hub's)."""
    from gnll.backends.resolve import HubUnreachable

    return (HubUnreachable,)


def _message(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]  # KeyError's str() adds quotes
    text = text.strip()
    own = type(exc).__module__.startswith("gnll") or type(exc) in (ValueError, KeyError)
    if not text or not own:
        # The class says what kind of failure it was ("PermissionError: ...", "OutOfMemoryError").
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


DebugOption = Annotated[
    bool,
    typer.Option(
        "--debug",
        help="On an error, print the full traceback instead of one line.",
        envvar="GNLL_DEBUG",
    ),
]


def error_boundary(command: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: a ``--debug`` option and one clear line (and exit status) per error."""
    if getattr(command, "__gnll_boundary__", False):
        return command
    # Resolved annotations: typer reads the Annotated option declarations from the signature.
    sig = inspect.signature(command, eval_str=True)
    own_debug = "debug" in sig.parameters  # a command may use --debug itself (e.g. more logging)
    resumable = "resume" in sig.parameters  # eval, score, generate: finished work is kept

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug") if own_debug else kwargs.pop("debug", False))
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except (click.ClickException, _TyperClickException) as exc:  # click prints these
            exc.message = safe_text(scrub(exc.message, _secret_values(kwargs)))
            raise
        except KeyboardInterrupt:
            typer.echo(
                "interrupted: the work finished so far is kept; rerun the same command with "
                "--resume to continue"
                if resumable
                else "interrupted",
                err=True,
            )
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - this is the boundary
            secrets = _secret_values(kwargs)
            code, hint = classify(exc, resumable)
            if debug:
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                typer.echo(safe_text(scrub(tb, secrets)), err=True)
            line = f"error: {_message(exc)}"
            if hint:
                line += f"\n  what to do: {hint}"
            if not debug and code == EXIT_FAILURE:
                # A usage error's one line is the whole story; a failure's traceback may not be.
                line += "  (--debug shows the traceback)"
            typer.echo(safe_text(scrub(line, secrets)), err=True)
            raise typer.Exit(code) from None

    if not own_debug:
        debug_param = inspect.Parameter(
            "debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOption
        )
        params = [*sig.parameters.values(), debug_param]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**getattr(command, "__annotations__", {}), "debug": DebugOption}
    wrapper.__gnll_boundary__ = True  # type: ignore[attr-defined]
    return wrapper


def flagged(exc: BaseException, flags: dict[str, str] | None = None) -> str:
    """The message of a library :class:`~gnll._util.validation.ParameterError` with the parameters
    it names written as options: its leading parameter, and the ``others`` it mentions (``--`` + the
    name, or ``flags[name]``). Any other error: its message."""
    import re

    text = str(exc).strip("'\"")
    param = getattr(exc, "param", None)
    if not param:
        return text
    flags = flags or {}
    if text.startswith(param):
        text = flags.get(param, "--" + param) + text[len(param) :]
    for name in getattr(exc, "others", ()):
        text = re.sub(rf"(?<![\w'-]){re.escape(name)}\b", flags.get(name, "--" + name), text)
    return text
