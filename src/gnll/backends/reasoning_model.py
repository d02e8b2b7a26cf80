"""A model that thinks before it answers, run in-process: greedy trace, then greedy answer.

:class:`ReasoningModel` wraps any :class:`~gnll.backends.base.Model` (injection, not subclassing):
for each prompt it decodes the trace greedily after the template's opening (``<think>\\n``) until
the model writes the end-of-reasoning marker or the trace budget runs out (then the marker is
forced, as budget forcing does), and decodes the answer with the caller's configuration
conditioned on prompt + trace + marker. The answer's generation is what every measure sees (its
G-NLL is the answer's, given the trace); the trace rides along in
:attr:`~gnll.backends.base.Generation.reasoning` (:mod:`gnll.backends.reasoning`), its log-probs
included, for trace measures. ``load_model(..., reasoning="think")`` builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

from gnll.backends.base import Generation, GenerationConfig, Model, ScoredAnswer, StreamingModel
from gnll.backends.reasoning import ReasoningFormat, ReasoningSplit, reasoning_format

__all__ = ["ReasoningModel"]


def trace_text(trace: Generation) -> str:
    """A trace's exact text: its tokens joined, white space included (``Generation.text`` is
    stripped), or the stripped text where the tokens do not render it (a character split over
    tokens, text before the marker inside the token that began it)."""
    joined = "".join(trace.tokens)
    return joined if joined.strip() == trace.text else trace.text


class ReasoningModel(Model):
    """Greedy trace, then the answer, with G-NLL over the answer only.

    Parameters
    ----------
    model:
        The model that reasons.
    fmt:
        ``"think"`` (``<think>…</think>``), ``"harmony"`` or ``"marker:TEXT"``.
    trace_budget:
        Most trace tokens; past it the marker is forced.
    opening:
        Text the template puts after the rendered prompt to open the trace (DeepSeek-R1's template
        ends with ``<think>\\n``); ``None``: ``<think>\\n`` for ``think``, nothing otherwise.
    separator:
        Text between the marker and the answer (the ``\\n\\n`` reasoning models write there).

    Notes
    -----
    The answer is conditioned on ``rendered prompt + opening + trace + "\\n" + marker +
    separator`` (re-encoded from text): its G-NLL is exact for that context, which
    :meth:`context` returns and ``gnll score`` teacher-forces.
    """

    def __init__(
        self,
        model: Model,
        fmt: ReasoningFormat | str = "think",
        *,
        trace_budget: int = 256,
        opening: str | None = None,
        separator: str = "\n\n",
    ) -> None:
        self.model = model
        self.fmt = reasoning_format(fmt)
        if int(trace_budget) < 1:
            raise ValueError(f"trace_budget must be >= 1, got {trace_budget}")
        self.trace_budget = int(trace_budget)
        self.opening = (
            ("<think>\n" if self.fmt.name == "think" else "") if opening is None else opening
        )
        self.separator = separator
        self.name = model.name
        self.capabilities = replace(
            model.capabilities, beams=False, streaming=False, reasoning=self.fmt.name
        )

    def __repr__(self) -> str:
        return f"ReasoningModel({self.model!r}, {self.fmt.name!r})"

    def render_prompt(self, prompt: str) -> str:
        """The text the trace is decoded from: the model's rendering plus the trace's opening."""
        return self.model.render_prompt(prompt) + self.opening

    def context(self, prompt: str, trace: str, *, raw_prompt: bool = False) -> str:
        """The exact text the answer is conditioned on, for a trace."""
        head = prompt + self.opening if raw_prompt else self.render_prompt(prompt)
        return f"{head}{trace}\n{self.fmt.text}{self.separator}"

    def info(self) -> dict[str, Any]:
        return {
            **self.model.info(),
            "reasoning": {
                "format": self.fmt.name,
                "trace_budget": self.trace_budget,
                "opening": self.opening,
                "separator": self.separator,
            },
        }

    def traces(
        self, prompts: Sequence[str], *, raw_prompt: bool = False, batch_size: int | None = None
    ) -> list[Generation]:
        """The greedy traces of ``prompts`` (stopped at the marker or the budget)."""
        heads = [p + self.opening if raw_prompt else self.render_prompt(p) for p in prompts]
        config = GenerationConfig.greedy(max_new_tokens=self.trace_budget, stop=(self.fmt.text,))
        out = self.model.generate(heads, config, raw_prompt=True, batch_size=batch_size)
        return [g[0] for g in out]

    def answer_decoder(self) -> StreamingModel | None:
        """The wrapped model's decoding loop (when it has one): it decodes the answer phase."""
        return cast(StreamingModel, self.model) if self.model.capabilities.streaming else None

    def generate_answers(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        answer: Callable[[list[str], GenerationConfig], list[list[Generation]]],
        *,
        raw_prompt: bool = False,
    ) -> list[list[Generation]]:
        return self.generate(prompts, config, raw_prompt=raw_prompt, answer=answer)

    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool | Callable[[float], None] = False,
        raw_prompt: bool = False,
        answer: Callable[[list[str], GenerationConfig], list[list[Generation]]] | None = None,
    ) -> list[list[Generation]]:
        """Greedy traces, then each answer given prompt + trace + marker.

        ``answer``: decodes the answers from their contexts (rendered: raw prompts) with the
        configuration, one list of generations per context; ``None``: the model's own
        ``generate``. ``gnll serve`` and ``gnll generate`` give their decoding loop, which stops
        an answer at its exact early decision: it sees the answer tokens only, after the marker,
        so the trace is never cut and never counts.
        """
        config = config or GenerationConfig.greedy()
        if config.strategy == "beam":
            raise NotImplementedError(
                "beam search over a reasoning model's answer is not supported"
            )
        traces = self.traces(prompts, raw_prompt=raw_prompt, batch_size=batch_size)
        contexts = [
            self.context(p, trace_text(t), raw_prompt=raw_prompt)
            for p, t in zip(prompts, traces, strict=True)
        ]
        if answer is not None:
            answers = answer(contexts, config)
        else:
            answers = self.model.generate(
                contexts, config, batch_size=batch_size, progress=progress, raw_prompt=True
            )
        return [
            [replace(g, reasoning=self._split(t, g)) for g in gs]
            for t, gs in zip(traces, answers, strict=True)
        ]

    def _split(self, trace: Generation, answer: Generation) -> ReasoningSplit:
        generated = trace.finish_reason == "stop"  # the model wrote the marker itself
        n_trace = len(trace.token_logprobs)
        marker = tuple(trace.terminator_logprobs) if generated else None
        n_marker = len(trace.terminator_logprobs) if generated else 0
        n_answer = len(answer.token_ids) + len(answer.terminator_token_ids)
        notes = (
            ()
            if generated
            else (
                f"the trace reached its budget ({self.trace_budget} tokens) or ended without the "
                f"marker; the marker {self.fmt.text!r} was forced",
            )
        )
        return ReasoningSplit(
            n_trace,
            n_trace + n_marker,
            n_trace + n_marker + n_answer,
            self.fmt.name,
            "generated",
            tuple(float(x) for x in trace.token_logprobs),
            marker,
            notes,
            trace_text(trace),
        )

    def score(
        self,
        prompts: Sequence[str],
        answers: Sequence[str],
        *,
        raw_prompt: bool = False,
        batch_size: int | None = None,
        progress: bool = False,
        traces: Sequence[str] | None = None,
    ) -> list[ScoredAnswer]:
        """Teacher-forced answers given prompt + trace (``traces``; ``None``: the model's own
        greedy traces), the trace being context, not answer."""
        given = list(traces) if traces is not None else [None] * len(prompts)
        todo = [i for i, t in enumerate(given) if t is None]
        if todo:
            own = self.traces([prompts[i] for i in todo], raw_prompt=raw_prompt)
            for i, t in zip(todo, own, strict=True):
                given[i] = trace_text(t)
        traces = [str(t) for t in given]
        contexts = [
            self.context(p, t, raw_prompt=raw_prompt) for p, t in zip(prompts, traces, strict=True)
        ]
        return self.model.score(
            contexts, answers, raw_prompt=True, batch_size=batch_size, progress=progress
        )
