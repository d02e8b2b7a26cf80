"""Start-up options of ``gnll serve`` that the app reads on every request."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gnll._util.validation import ParameterError
from gnll.policy import AbstentionPolicy
from gnll.serving.observers import Observer

if TYPE_CHECKING:
    from gnll.calibration.decisions import DecisionCalibration

#: In-process ``max_tokens`` when a request gives none (``--default_max_tokens``).
DEFAULT_MAX_TOKENS = 100
#: In-process: the most ``max_tokens`` a request may ask for (``--max_tokens_limit``).
MAX_TOKENS_LIMIT = 512


@dataclass
class ServeSettings:
    """Operational limits, auth and the abstention policy.

    Parameters
    ----------
    api_key:
        Bearer token every ``/v1`` and ``/metrics`` request must carry (``None``: no auth).
        Defaults to ``$GNLL_API_KEY``. Never logged, never echoed in errors.
    max_request_bytes:
        Request bodies above this are refused with 413 before they are parsed.
    default_max_tokens, max_tokens_limit:
        ``max_tokens`` when a request gives none, and the most a request may ask for (a 400 that
        names ``--max_tokens_limit`` above). ``None`` (the default): in-process,
        :data:`DEFAULT_MAX_TOKENS` and :data:`MAX_TOKENS_LIMIT`; in proxy mode the upstream's own
        (a request without ``max_tokens`` goes upstream without it). :meth:`token_bounds` resolves
        them per mode.
    log_prompts:
        Put prompt and answer texts into the access log (off: only sizes and uncertainty).
    data_dir:
        Where the web page's example questions come from (``../shared/data`` layout).
    upstream_timeout:
        Proxy mode: seconds per upstream request (504 past it).
    upstream_idle_timeout:
        Proxy mode: seconds a stream from the upstream may send nothing once it has begun (an
        error event naming the upstream past it; at most ``upstream_timeout``).
    body_timeout:
        Seconds a request body may take to arrive (408 past it: a slow sender holds a connection).
    prompt_format:
        How ``/v1/chat/completions`` messages become the model's prompt
        (:mod:`gnll.backends.prompting`): ``"chat"``, the messages through the model's chat
        template; ``"instruction"``, one user message taken as a question and asked as ``gnll
        ask`` asks it (in-process only). ``/v1/completions`` prompts are always ``"text"``. A
        calibration fitted on another format than the chat requests' is refused here.
    early:
        Exact early decisions under ``--policy refuse`` or ``escalate`` (:mod:`gnll.measures.early`):
        an in-process answer stops at the first token after which the policy refuses or escalates
        it whatever comes next, with the same decision as at its end. ``None`` (the default): on
        whenever the policy allows it (a threshold, a fitted rule, or a non-increasing calibrated
        map) for an in-process model; in proxy mode, see :meth:`proxy_decides_early`. ``True``:
        required (an error when the policy does not allow it); ``False``: off.
        :attr:`decides_early` is the outcome.
    tracing:
        A :class:`gnll.serving.tracing.Emitter` (``--otel``): OpenTelemetry events of every
        answer's scores; ``None`` (the default) emits nothing and imports nothing. It is one of the
        observers the app notifies (:mod:`gnll.serving.observers`).
    tool_argument_threshold:
        A tool call is also withheld (``--policy refuse``/``escalate``) when one of its argument
        values' NLL is above this (:func:`gnll.policy.tools.gate_calls`); ``None``: only the
        call's G-NLL decides.
    """

    api_key: str | None = field(default_factory=lambda: os.environ.get("GNLL_API_KEY") or None)
    max_request_bytes: int = 1_000_000
    default_max_tokens: int | None = None
    max_tokens_limit: int | None = None
    log_prompts: bool = False
    policy: AbstentionPolicy = field(default_factory=AbstentionPolicy)
    data_dir: Path | None = None
    upstream_timeout: float = 120.0
    upstream_idle_timeout: float = 30.0
    body_timeout: float = 30.0
    prompt_format: str = "chat"
    tracing: Observer | None = None
    early: bool | None = None
    tool_argument_threshold: float | None = None
    #: A :class:`gnll.calibration.decisions.DecisionCalibration` applied to ``/v1/decisions``.
    decisions_calibration: DecisionCalibration | None = None

    def __post_init__(self) -> None:
        #: Whether answers stop at exact early decisions (``early`` resolved against the policy).
        self.decides_early = self._early()
        if self.prompt_format not in ("chat", "instruction"):
            raise ParameterError(
                "prompt_format",
                f"renders chat requests as 'chat' or 'instruction', not {self.prompt_format!r}",
            )
        self._check_cascade()
        cal = self.policy.calibrator
        if cal is not None:
            from gnll.calibration import CalibrationFormatError, calibration_applies

            if not calibration_applies(cal, self.prompt_format):
                fitted = cal.meta["prompt_format"]
                hint = (
                    "pass --prompt-format instruction (a chat request's one user message is then "
                    "a question, asked as gnll ask asks it)"
                    if fitted == "instruction"
                    else f"use a calibration fitted on {self.prompt_format!r} answers"
                )
                raise CalibrationFormatError(
                    f"the calibration ({cal.meta.get('path', 'given')}) was fitted on answers to "
                    f"{fitted!r} prompts, but chat requests are rendered as {self.prompt_format!r}: "
                    f"its P(correct) would not apply; {hint}"
                )
        if self.max_request_bytes < 1024:
            raise ParameterError(
                "max_request_bytes", f"must be >= 1024, got {self.max_request_bytes}"
            )
        if not self.upstream_idle_timeout > 0:
            raise ParameterError(
                "upstream_idle_timeout", f"must be > 0 seconds, got {self.upstream_idle_timeout}"
            )
        if not self.body_timeout > 0:
            raise ParameterError("body_timeout", f"must be > 0 seconds, got {self.body_timeout}")
        default, limit = self._inprocess_bounds()
        if not 1 <= default <= limit:
            raise ParameterError(
                "default_max_tokens",
                f"({default}) must be between 1 and max_tokens_limit ({limit})",
                others=("max_tokens_limit",),
            )
        if self.max_tokens_limit is not None and self.max_tokens_limit < 1:
            raise ParameterError("max_tokens_limit", f"must be >= 1, got {self.max_tokens_limit}")

    def token_bounds(self, mode: str) -> tuple[int | None, int | None]:
        """``(default max_tokens, max_tokens limit)`` for a service of ``mode`` (``"model"`` or
        ``"proxy"``): an in-process model needs both (:data:`DEFAULT_MAX_TOKENS`,
        :data:`MAX_TOKENS_LIMIT` unless set); a proxy bounds nothing unless told (``None``: the
        upstream's own default and limit apply)."""
        if mode == "proxy":
            return self.default_max_tokens, self.max_tokens_limit
        return self._inprocess_bounds()

    def _inprocess_bounds(self) -> tuple[int, int]:
        limit = self.max_tokens_limit or MAX_TOKENS_LIMIT
        return self.default_max_tokens or min(DEFAULT_MAX_TOKENS, limit), limit

    def _check_cascade(self) -> None:
        """A cascade threshold fitted on the chat requests' prompt format (unless told). The
        policy's own rules (it decides when it must, never on every answer) it checks itself."""
        pol = self.policy
        cascade = pol.cascade
        if cascade is not None and not pol.any_prompt_format:
            from gnll.calibration import CalibrationFormatError

            if not cascade.applies(self.prompt_format):
                fitted = cascade.prompt_format
                hint = (
                    "set prompt_format 'instruction' (a chat request's one user message is then a "
                    "question, asked in the zero-shot instruction prompt)"
                    if fitted == "instruction"
                    else f"fit the threshold on {self.prompt_format!r} answers"
                )
                error = CalibrationFormatError(
                    f"the cascade threshold ({cascade.meta.get('path', 'given')}) was fitted on "
                    f"answers to {fitted!r} prompts, but chat requests are rendered as "
                    f"{self.prompt_format!r}: its guarantee would not apply; {hint}, or set "
                    "any_prompt_format to apply it anyway"
                )
                error.others = ("prompt_format", "any_prompt_format")  # type: ignore[attr-defined]
                raise error

    def _early(self) -> bool:
        from gnll.measures.early import EarlyDecisionError

        if self.early is False:
            return False
        try:
            self.policy.early_decision()
        except EarlyDecisionError as exc:
            if self.early:
                raise EarlyDecisionError(
                    f"early: {exc}", param="early", others=(*filter(None, [exc.param]), *exc.others)
                ) from None
            return False
        return True

    def proxy_decides_early(self, streams_usage: bool) -> bool:
        """Whether a proxy cuts its upstream's answers at exact early decisions.

        ``streams_usage``: whether the upstream sends a usage chunk at the end of a stream. The
        proxy decides on a stream it reads from the upstream, and a stream the proxy cut has no
        usage (the upstream never counted it), so by default (``early`` ``None``) only
        ``escalate`` decides early, and only with an upstream that streams its usage: the client
        then gets the larger model's answer and usage after a cut, and a kept answer, read to its
        end, keeps the upstream's count. Under ``refuse`` (a cut answer's ``usage`` would be
        null) and with an upstream that counts nothing in streams (a kept answer's ``usage``
        would be null) it takes ``early=True``.
        """
        if not self.decides_early:
            return False
        if self.early:
            return True
        return self.policy.mode == "escalate" and streams_usage

    def __repr__(self) -> str:  # the key must not reach logs or tracebacks
        return (
            f"ServeSettings(auth={'on' if self.api_key else 'off'}, "
            f"max_request_bytes={self.max_request_bytes}, max_tokens_limit={self.max_tokens_limit}, "
            f"policy={self.policy.mode!r})"
        )
