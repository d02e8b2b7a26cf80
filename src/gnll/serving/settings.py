"""Start-up options of ``gnll serve`` that the app reads on every request."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnll.serving.uncertainty import AbstentionPolicy


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
        ``max_tokens`` when a request gives none, and the most a request may ask for (400 above).
    log_prompts:
        Put prompt and answer texts into the access log (off: only sizes and uncertainty).
    data_dir:
        Where the web page's example questions come from (``../shared/data`` layout).
    upstream_timeout:
        Proxy mode: seconds per upstream request (504 past it).
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
        map); ``True``: required (an error when the policy does not allow it); ``False``: off.
    tracing:
        A :class:`gnll.serving.tracing.Emitter` (``--otel``): OpenTelemetry events of every
        answer's scores; ``None`` (the default) emits nothing and imports nothing.
    """

    api_key: str | None = field(default_factory=lambda: os.environ.get("GNLL_API_KEY") or None)
    max_request_bytes: int = 1_000_000
    default_max_tokens: int = 100
    max_tokens_limit: int = 512
    log_prompts: bool = False
    policy: AbstentionPolicy = field(default_factory=AbstentionPolicy)
    data_dir: Path | None = None
    upstream_timeout: float = 120.0
    body_timeout: float = 30.0
    prompt_format: str = "chat"
    tracing: Any = None
    early: bool | None = None

    def __post_init__(self) -> None:
        self.early = self._early()
        if self.prompt_format not in ("chat", "instruction"):
            raise ValueError(
                f"chat requests can be rendered as 'chat' or 'instruction', not {self.prompt_format!r}"
            )
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
            raise ValueError(f"--max_request_bytes must be >= 1024, got {self.max_request_bytes}")
        if not self.body_timeout > 0:
            raise ValueError(f"--body_timeout must be > 0 seconds, got {self.body_timeout}")
        if not 1 <= self.default_max_tokens <= self.max_tokens_limit:
            raise ValueError(
                f"--default_max_tokens ({self.default_max_tokens}) must be between 1 and "
                f"--max_tokens_limit ({self.max_tokens_limit})"
            )

    def _early(self) -> bool:
        from gnll.measures.early import EarlyDecisionError

        if self.early is False:
            return False
        try:
            self.policy.early_decision()
        except EarlyDecisionError as exc:
            if self.early:
                raise EarlyDecisionError(f"--early: {exc}") from None
            return False
        return True

    def __repr__(self) -> str:  # the key must not reach logs or tracebacks
        return (
            f"ServeSettings(auth={'on' if self.api_key else 'off'}, "
            f"max_request_bytes={self.max_request_bytes}, max_tokens_limit={self.max_tokens_limit}, "
            f"policy={self.policy.mode!r})"
        )
