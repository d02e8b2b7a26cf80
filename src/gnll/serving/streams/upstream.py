"""Reassembling a streamed choice, so the parser of whole responses can read it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gnll.backends.reasoning import ReasoningStream

if TYPE_CHECKING:
    from gnll.serving.protocol.common import Shape


class StreamedChoice:
    """The pieces of one choice of a server-sent-event stream, in arrival order.

    Examples
    --------
    >>> from gnll.serving.protocol.completions import COMPLETIONS
    >>> sc = StreamedChoice(COMPLETIONS)
    >>> sc.add({"text": " Par", "logprobs": {"tokens": [" Par"], "token_logprobs": [-0.1]}})
    >>> sc.add({"text": "is", "logprobs": {"tokens": ["is"], "token_logprobs": [-0.2]},
    ...         "finish_reason": "stop"})
    >>> c = sc.choice()
    >>> c["text"], c["logprobs"]["token_logprobs"], c["finish_reason"]
    (' Paris', [-0.1, -0.2], 'stop')
    """

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.text: list[str] = []
        self.content: list[dict[str, Any]] = []  # chat / llama.cpp shape
        self.tokens: list[str] = []  # legacy completions shape
        self.token_logprobs: list[Any] = []
        self.top_logprobs: list[Any] = []
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.has_stop_reason = False
        self.reasoning: list[str] = []
        #: Each token labelled trace / marker / answer by the delta it came with.
        self.labeller = ReasoningStream()

    def add(self, choice: dict[str, Any]) -> None:
        self.labeller.add(choice)
        text, reasoning = self.shape.delta_texts(choice)
        self.text.append(text)
        if reasoning is not None:
            self.reasoning.append(reasoning)
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            if isinstance(lp.get("content"), list):
                self.content.extend(lp["content"])
            elif isinstance(lp.get("tokens"), list):
                self.tokens.extend(lp["tokens"])
                self.token_logprobs.extend(lp.get("token_logprobs") or [])
                self.top_logprobs.extend(lp.get("top_logprobs") or [None] * len(lp["tokens"]))
        if isinstance(choice.get("token_ids"), list):
            self.token_ids.extend(choice["token_ids"])
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if "stop_reason" in choice:
            self.has_stop_reason = True
            if choice["stop_reason"] is not None:
                self.stop_reason = choice["stop_reason"]

    @property
    def labels(self) -> list[Any] | None:
        """Per-token trace/marker/answer labels when the stream carried reasoning, else ``None``."""
        return self.labeller.labels if self.labeller.reasoning else None

    def choice(self) -> dict[str, Any]:
        """A non-streaming ``choices[i]`` with everything the stream said."""
        text = "".join(self.text)
        if self.content:
            logprobs: dict[str, Any] = {"content": self.content}
        else:
            logprobs = {
                "tokens": self.tokens,
                "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs,
            }
        out: dict[str, Any] = {"logprobs": logprobs, "finish_reason": self.finish_reason}
        out.update(self.shape.whole_choice(text))
        if any(self.reasoning):
            out["message"]["reasoning"] = "".join(self.reasoning)
        if self.token_ids:
            out["token_ids"] = self.token_ids
        if self.has_stop_reason:
            out["stop_reason"] = self.stop_reason
        return out
