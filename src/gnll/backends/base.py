"""The backend interface: a model turns prompts into generations that carry token log-probabilities."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from gnll.backends.early import EarlyDecided
from gnll.backends.reasoning import ReasoningSplit

Strategy = Literal["greedy", "beam", "sample"]
#: ``"decided"``: ``gnll serve`` stopped the answer at an exact early decision (its policy refuses or
#: escalates it whatever follows), so its text is the part released by then.
FinishReason = Literal["stop", "eos", "length", "decided"]

#: Stop sequences of the paper's QA protocol: an answer ends at a newline or where the model starts the
#: next few-shot block.
DEFAULT_STOP: tuple[str, ...] = ("\n", "Question:", "Context:")

#: What gnll promises about batching: a prompt's generated tokens do not depend on the batch it runs
#: in (its size, padding, a shared prefix prefilled once, the decoding loop or ``generate``), and
#: its token log-probs agree within this absolute tolerance. They are not bit-identical: fp32 sums
#: in another order (a row scored alone vs in a batch) moved one token's log-prob by 1.9e-5 on
#: SmolLM2. A run that repeats the same batches (a resumed chunk, Ray against local) is exact.
BATCH_INVARIANCE_ATOL = 1e-4


class ChatPrompt(str):
    """A prompt's plain text that also carries its chat turns.

    The string value is the prompt as a completion model (or a cache, or a fingerprint) sees it;
    ``messages`` are the same content as ``[{"role": ..., "content": ...}, ...]`` turns, which a
    backend with a chat template renders instead of wrapping the whole text as one user turn
    (few-shot examples as user/assistant exchanges, as lm-eval-harness's ``--fewshot_as_multiturn``).
    String operations return plain ``str``: the turns go only where the object itself goes.

    >>> turns = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
    ...          {"role": "user", "content": "2+2?"}]
    >>> p = ChatPrompt("1+1? 2 2+2?", turns)
    >>> p == "1+1? 2 2+2?", len(chat_messages(p)), chat_messages("hi")
    (True, 3, [{'role': 'user', 'content': 'hi'}])
    """

    messages: tuple[dict[str, Any], ...]

    def __new__(cls, text: str, messages: Sequence[dict[str, Any]]) -> ChatPrompt:
        if not messages:
            raise ValueError("a ChatPrompt needs at least one turn")
        obj = super().__new__(cls, text)
        obj.messages = tuple(openai_turns(messages))
        return obj

    @classmethod
    def of(cls, messages: Sequence[dict[str, Any]]) -> ChatPrompt:
        r"""Turns as a prompt whose plain text is their contents joined by blank lines (what a
        model without a chat template sees).

        >>> ChatPrompt.of([{"role": "system", "content": "Be brief."},
        ...                {"role": "user", "content": "Hi?"}])
        'Be brief.\n\nHi?'
        """
        return cls("\n\n".join(str(m.get("content", "")) for m in messages), messages)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChatPrompt, (str(self), list(self.messages)))


def openai_turns(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat turns as OpenAI and vLLM hand them to a chat template: the ``developer`` role (what
    OpenAI's SDKs send for instructions) as ``system``; every other field (``tool_calls``,
    ``tool_call_id``, ``name``) kept. Every renderer takes its turns through here, so one
    conversation conditions the model the same way in-process, in ``gnll score`` and upstream.

    >>> openai_turns([{"role": "developer", "content": "Be brief."}])
    [{'role': 'system', 'content': 'Be brief.'}]
    """
    return [{**m, "role": "system"} if m.get("role") == "developer" else dict(m) for m in messages]


def chat_messages(prompt: str) -> list[dict[str, Any]]:
    """The chat turns of ``prompt``: its own (:class:`ChatPrompt`) or the whole text as one user turn."""
    turns = getattr(prompt, "messages", None)
    if turns:
        return [dict(m) for m in turns]
    return [{"role": "user", "content": str(prompt)}]


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode.

    Parameters
    ----------
    strategy:
        ``"greedy"`` (one output), ``"beam"`` (``num_sequences`` beams, all returned, best first) or
        ``"sample"`` (``num_sequences`` independent multinomial samples at ``temperature``).
    num_sequences:
        Beams K or samples N per prompt. Must be 1 for greedy.
    temperature:
        Sampling temperature (only for ``"sample"``). Token log-probs reported in
        :attr:`Generation.token_logprobs` are always under the temperature-1 model distribution; the
        log-probs under the tempered sampling distribution are in :attr:`Generation.sampling_logprobs`.
    max_new_tokens:
        Hard cap on generated tokens (the paper: 50 for short answers, 100 for long ones).
    stop:
        Stop sequences. The answer is the text before the first one; its tokens are the tokens that lie
        entirely before it. The end-of-sequence token always stops.
    include_terminator:
        If true, the log-probs of the token(s) that produced the stop sequence (or the EOS token) are
        appended to the answer's ``token_logprobs`` -- i.e. the probability of *ending* the answer there
        is counted. Off by default, as in the paper's reference code.
    seed:
        Seed for sampling (``None`` acts as 0). Sample j of a prompt depends on the seed, the prompt
        and j only (see :func:`gnll._util.seeds.sample_seed`): not on the batch size, the other prompts of the call
        or the prompt's position among them, so a resumed run draws the very same samples.

    Examples
    --------
    >>> GenerationConfig.sample(10, temperature=0.5).num_sequences
    10
    """

    strategy: Strategy = "greedy"
    num_sequences: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 50
    stop: tuple[str, ...] = DEFAULT_STOP
    include_terminator: bool = False
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.strategy not in ("greedy", "beam", "sample"):
            raise ValueError(
                f"strategy must be 'greedy', 'beam' or 'sample', got {self.strategy!r}"
            )
        if self.num_sequences < 1:
            raise ValueError(f"num_sequences must be >= 1, got {self.num_sequences}")
        if self.strategy == "greedy" and self.num_sequences != 1:
            raise ValueError(
                "greedy decoding returns exactly one sequence; use strategy='beam' for more"
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(
                f"temperature must be a positive finite number, got {self.temperature}"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop sequences must be non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def greedy(cls, **kwargs: Any) -> GenerationConfig:
        return cls(strategy="greedy", num_sequences=1, **kwargs)

    @classmethod
    def beam(cls, num_beams: int = 5, **kwargs: Any) -> GenerationConfig:
        return cls(strategy="beam", num_sequences=num_beams, **kwargs)

    @classmethod
    def sample(
        cls, num_samples: int = 10, temperature: float = 1.0, **kwargs: Any
    ) -> GenerationConfig:
        return cls(strategy="sample", num_sequences=num_samples, temperature=temperature, **kwargs)

    def replace(self, **changes: Any) -> GenerationConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


class EmptyAnswerError(ValueError):
    """An empty answer whose stop token's log-prob is unknown: no measure can score it."""


class ContextOverflow(ValueError):
    """A prompt that, with the tokens to generate, does not fit the model's context.

    ``str()`` says it for a prompt of a batch (as ``gnll eval`` builds them, with few-shot
    examples); :meth:`for_question` for a user's own question (``gnll ask``, ``gnll generate``).
    """

    def __init__(
        self, model: str, index: int, prompt_tokens: int, max_new_tokens: int, context: int
    ) -> None:
        self.model, self.index = model, index
        self.prompt_tokens, self.max_new_tokens, self.context = (
            prompt_tokens,
            max_new_tokens,
            context,
        )
        super().__init__(
            f"prompt {index} has {prompt_tokens} tokens; with max_new_tokens={max_new_tokens} "
            f"that exceeds {model}'s context of {context} tokens: shorten the prompt (e.g. fewer "
            "few-shot examples) or lower max_new_tokens"
        )

    def for_question(self) -> str:
        return (
            f"the question is too long: its prompt has {self.prompt_tokens} tokens, and with "
            f"--max_new_tokens {self.max_new_tokens} that exceeds {self.model}'s context of "
            f"{self.context} tokens; shorten the question or lower --max_new_tokens"
        )


@dataclass
class Generation:
    """One generated output and the evidence the uncertainty measures need.

    Attributes
    ----------
    text:
        The answer: decoded text before the first stop sequence, stripped of surrounding white space.
    token_ids, tokens:
        The answer's tokens (those entirely before the stop sequence), as ids and as decoded strings.
    token_logprobs:
        ``log p(y_t | x, y_<t)`` for each answer token: log-softmax of the model's raw, temperature-1,
        unwarped logits at the chosen token, computed in float32 or better. With
        ``include_terminator=True`` the terminator's log-probs are appended.
    finish_reason:
        ``"stop"`` (a stop sequence), ``"eos"`` (end-of-sequence token), ``"length"`` (max_new_tokens)
        or ``"decided"`` (``gnll serve`` stopped it at an exact early decision).
    stop_sequence:
        Which stop sequence ended the answer, if any.
    terminator_token_ids, terminator_logprobs:
        The token(s) that produced the stop sequence or EOS and their log-probs (empty for "length").
    sampling_logprobs:
        For sampled outputs: log-probs of the answer tokens under the distribution actually sampled from
        (temperature-scaled); for an empty answer, of its first terminator token (the empty-answer
        rule of :attr:`measured_logprobs` under that distribution). ``None`` for greedy and beam
        outputs.
    reasoning:
        For a reasoning model (:mod:`gnll.backends.reasoning`): where its output split into trace,
        end-of-reasoning marker and answer, with the trace's log-probs. Every other field is the
        answer's, so every measure sees the answer's tokens only (G-NLL of the answer conditioned
        on prompt + trace). ``None`` for an output without reasoning.
    early:
        For an answer stopped at an exact early decision (``finish_reason`` ``"decided"``): where
        and what it saved (:class:`~gnll.backends.early.EarlyDecided`); else ``None``.
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    token_logprobs: list[float]
    finish_reason: FinishReason
    stop_sequence: str | None = None
    terminator_token_ids: list[int] = field(default_factory=list)
    terminator_logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] | None = None
    reasoning: ReasoningSplit | None = None
    early: EarlyDecided | None = None

    @property
    def measured_logprobs(self) -> list[float]:
        """The token log-probs every uncertainty measure and every ranking sees for this output.

        The answer's :attr:`token_logprobs`; for an **empty answer** (no answer tokens: the model
        ended at once), the log-prob of the token that ended it (the first terminator token), as in
        Farquhar et al.'s code. An empty answer is thus exactly as certain as the model was in
        stopping there, never "log-likelihood 0" (maximal certainty). This is gnll's one rule for
        empty answers: ``gnll ask``, ``score``, ``serve``, ``eval``, the beam ranking and the
        Fig. 2 ablation all take their log-probs from here.

        Raises
        ------
        EmptyAnswerError
            The answer is empty and the log-prob of the token that ended it is unknown (a server
            that does not report it): no measure can score it.

        Examples
        --------
        >>> Generation("", [], [], [], "stop", terminator_token_ids=[198],
        ...            terminator_logprobs=[-2.5, -0.1]).measured_logprobs
        [-2.5]
        >>> Generation("Paris", [7], ["Paris"], [-0.2], "stop").measured_logprobs
        [-0.2]
        """
        if self.token_ids or self.tokens:
            return [float(x) for x in self.token_logprobs]
        if self.terminator_logprobs:
            return [float(self.terminator_logprobs[0])]
        raise EmptyAnswerError(
            "the answer is empty and the log-prob of the token that ended it "
            f"({self.finish_reason}) is unknown, so no uncertainty measure can score it "
            "(an empty answer is scored by its stop token's log-prob)"
        )

    @property
    def logprob(self) -> float:
        """Sequence log-likelihood ``log p(y|x)`` of :attr:`measured_logprobs` (beams rank by it)."""
        return float(np.sum(self.measured_logprobs)) + 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.reasoning is None:
            del d["reasoning"]  # an output without reasoning stays byte-identical
        else:
            d["reasoning"] = self.reasoning.to_dict()
        if self.early is None:
            del d["early"]  # likewise for an answer that ran to its end
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Generation:
        data = dict(data)
        if data.get("reasoning") is not None:
            data["reasoning"] = ReasoningSplit.from_dict(data["reasoning"])
        if data.get("early") is not None:
            data["early"] = EarlyDecided.from_dict(data["early"])
        return cls(**data)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can compute, declared up front so callers fail before any work, not after.

    Attributes
    ----------
    beams:
        Beam search (``GenerationConfig.beam``): needed by BS-MSP and the top-beam reference answer.
    scoring:
        Teacher-forced scoring of given answers (:meth:`Model.score`): needed by ``gnll score``.
    terminator:
        Reports the log-prob of the token(s) that ended the answer (``include_terminator=True``).
    chat:
        Applies the model's chat template to prompts (instruction-tuned models).
    sampling_logprobs:
        Reports log-probs under the tempered sampling distribution (:attr:`Generation.sampling_logprobs`).
    top_logprobs:
        How many most-likely alternatives per position the backend can report (0: none).
    streaming:
        The model is a :class:`StreamingModel`: it runs a decoding loop that prompts can join
        while it runs and that reports tokens as they are decoded (``gnll serve`` batches requests
        continuously and streams live with it).
    reasoning:
        The reasoning format (:mod:`gnll.backends.reasoning`: ``"think"``, ``"harmony"``,
        ``"marker"``) of a model that reasons before it answers; ``None``: its output is its
        answer. Callers ask this (and :attr:`Model.scored`), never the model's class.

    Examples
    --------
    >>> Capabilities(beams=False, scoring=False).missing(["beams"])
    ['beams']
    """

    beams: bool = True
    scoring: bool = True
    terminator: bool = True
    chat: bool = False
    sampling_logprobs: bool = True
    top_logprobs: int = 0
    streaming: bool = False
    reasoning: str | None = None

    def missing(self, needs: Sequence[str]) -> list[str]:
        """The capabilities among ``needs`` (attribute names) that this backend lacks."""
        return [n for n in needs if not getattr(self, n)]


@dataclass
class ScoredAnswer:
    """A given answer scored by teacher forcing: what :meth:`Model.score` returns per item.

    Attributes
    ----------
    text:
        The answer as given.
    token_ids, tokens:
        The answer's tokens, taken from one tokenisation of the whole prompt + answer.
    token_logprobs:
        ``log p(y_t | x, y_<t)`` of each answer token (raw, temperature-1 model distribution).
    is_greedy:
        True when every answer token is the model's top-1 token at its position (``None`` when the
        backend cannot tell).
    greedy_stops:
        True when greedy decoding would end the answer right after its last token (the top-1 next
        token is end-of-sequence or starts a stop sequence); ``None`` when unknown.
    boundary_merged:
        True when the tokeniser merged text across the prompt/answer boundary, so that the answer's
        tokens are not a clean suffix of the joint tokenisation; such rows are reported, not scored
        silently wrong.
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    token_logprobs: list[float]
    is_greedy: bool | None = None
    greedy_stops: bool | None = None
    boundary_merged: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def nll(self) -> float:
        """Negative log-likelihood of the answer, ``-sum_t log p(y_t | ...)`` (never ``-0.0``)."""
        return 0.0 - float(np.sum(self.token_logprobs)) if self.token_logprobs else 0.0

    @property
    def ln_nll(self) -> float:
        """Length-normalised NLL (mean over answer tokens)."""
        return self.nll / self.num_tokens if self.num_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Model(ABC):
    """A language model adapter: prompts in, generations with token log-probs out.

    Prompts are the *user text* (the task's prompt). Instruction-tuned models wrap it in their chat
    template; :meth:`render_prompt` shows the exact string the model conditions on. A
    :class:`ChatPrompt` carries its own turns; :meth:`render_chat` renders a conversation. With
    ``raw_prompt=True`` a prompt is the exact text the model conditions on (no template).

    Attributes
    ----------
    name:
        Short name used in results and tables.
    capabilities:
        What the backend computes (:class:`Capabilities`); callers check it before any work.
        ``capabilities.streaming`` says the model is also a :class:`StreamingModel`. A backend
        that declares nothing claims nothing beyond greedy and sampled generation: beams,
        scoring, terminator and tempered log-probs are claimed, not assumed.
    """

    name: str
    capabilities: Capabilities = Capabilities(
        beams=False, scoring=False, terminator=False, sampling_logprobs=False
    )

    @property
    def scored(self) -> Literal["answer", "output"]:
        """Which tokens this model's G-NLL covers: ``"answer"`` (a reasoning model's answer after
        its end-of-reasoning marker, given the trace) or ``"output"`` (the whole output). A
        calibration is fitted on one of the two and is checked against it."""
        return "answer" if self.capabilities.reasoning else "output"

    def answer_decoder(self) -> StreamingModel | None:
        """The decoding loop that decodes this model's answers apart from the rest of its output
        (a reasoning model's answer phase, after its trace), when a caller's loop may decode
        them (:meth:`generate_answers`); ``None``: none."""
        return None

    def generate_answers(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        answer: Callable[[list[str], GenerationConfig], list[list[Generation]]],
        *,
        raw_prompt: bool = False,
    ) -> list[list[Generation]]:
        """:meth:`generate`, the answer phase decoded by ``answer`` (contexts and configuration
        in, one list of generations per context out): the declared hook through which ``gnll
        serve`` and ``gnll generate`` run a model's answers through their own decoding loop. Only
        a model with an :meth:`answer_decoder` has an answer phase of its own."""
        raise NotImplementedError(f"{self.name} has no answer phase of its own")

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool | Callable[[float], None] = False,
        raw_prompt: bool = False,
    ) -> list[list[Generation]]:
        """Generate for every prompt; returns one list of ``config.num_sequences`` generations per prompt.

        ``progress=True`` shows the backend's own bar; a callable instead hears how many prompts
        have finished as they finish (fractions allowed), for a caller's bar. A backend that cannot
        tell may stay silent: callers account for whatever was not reported when the call returns.
        ``raw_prompt=True``: the prompts are the exact text to condition on (callers pass it only
        to a model whose ``capabilities.chat`` is true; other models render prompts verbatim).
        """

    @abstractmethod
    def score(
        self,
        prompts: Sequence[str],
        answers: Sequence[str],
        *,
        raw_prompt: bool = False,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[ScoredAnswer]:
        """Teacher-forced scores of ``answers[i]`` (text) as the continuation of ``prompts[i]``.

        Prompts are user text rendered exactly as :meth:`generate` renders them, unless
        ``raw_prompt=True``. Backends that cannot score declare ``capabilities.scoring = False``.
        """

    @abstractmethod
    def render_prompt(self, prompt: str) -> str:
        """The exact text the model conditions on for ``prompt`` (after any chat template)."""

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The exact text the model conditions on for a conversation of ``{role, content}`` turns.

        The one chat renderer every surface uses: :meth:`render_prompt` of :meth:`ChatPrompt.of`
        (the model's chat template when it has one; the contents joined by blank lines otherwise).
        """
        return self.render_prompt(ChatPrompt.of(messages))

    def info(self) -> dict[str, Any]:
        """Facts about the model to record with results (name, source, dtype, chat template use)."""
        return {"name": self.name}


@runtime_checkable
class StreamingModel(Protocol):
    """The decoding-loop hooks of a model whose ``capabilities.streaming`` is true.

    ``gnll serve`` encodes each request's prompts, checks them against the context, adds them to
    an open decoder as they arrive and hears the tokens it decodes (the hf backend's
    :class:`~gnll.backends.hf.decode.Decoder`).
    """

    name: str

    def open_decoder(self, config: GenerationConfig, *, width: int | None = None) -> Any:
        """A decoding loop prompts can join while it runs, or ``None`` for this ``config``."""

    def encode(self, prompts: Sequence[str], *, raw_prompt: bool = False) -> list[list[int]]:
        """The token ids the model conditions on for each prompt."""

    def check_context(self, encoded: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Raise ``ValueError`` for a prompt the context cannot hold (before any computing)."""

    def stop_rules(self, stop: tuple[str, ...]) -> Any:
        """The stopping rules for ``stop`` (token ids that stop, stop strings, answer split)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``."""


class GenerationErrors(RuntimeError):
    """Some prompts of a batch failed; the others' generations are kept, not thrown away.

    Raised by :meth:`Model.generate` when a per-prompt problem (a rejected request, an unusable
    response) hits only some prompts. A backend that cannot go on at all (server unreachable) raises
    an ordinary error instead.

    Attributes
    ----------
    results:
        One entry per prompt: its generations, or ``None`` where it failed.
    errors:
        Prompt index -> one-line reason.
    """

    def __init__(self, results: list[list[Generation] | None], errors: dict[int, str]) -> None:
        self.results, self.errors = results, dict(errors)
        first = min(self.errors)
        super().__init__(
            f"{len(self.errors)} of {len(results)} prompts failed "
            f"(first: prompt {first}: {self.errors[first]})"
        )
