"""The decoding loop: jobs of prompts decoded together, each greedy answer watched by its exact early
decision.

One loop serves every caller that decodes with an in-process model: the server's queue
(:class:`gnll.serving.engine.BatchingEngine`, which only adds the queue, its worker thread and
the asyncio hand-over), ``gnll generate --policy refuse`` (:class:`EarlyGreedy`, in the calling
thread) and a reasoning model's answer phase (:meth:`gnll.backends.base.Model.generate_answers`,
the declared hook: the trace runs to its end, the answers through this loop). Every job is built
at one site, :meth:`DecodingLoop.job`.

Two ways to decode a group of jobs with one configuration:

- **continuous** (a :class:`~gnll.backends.base.StreamingModel`, whose ``capabilities.streaming``
  says so: the hf backend): :meth:`DecodingLoop.drive` adds the jobs' prompts to the model's
  decoder; jobs handed over while it runs join at the next step, taking the slots of rows that
  finished; each job is settled as soon as its own rows end, and an answer whose rule decides
  stops there (:class:`EarlyStop`);
- **per call** (any other model): :meth:`DecodingLoop.call` runs the model's ``generate`` once
  for all of them.

Examples
--------
>>> from gnll.backends.base import Generation, GenerationConfig, Model
>>> class Echo(Model):  # a stand-in model: answers each prompt with itself
...     name = "echo"
...     def generate(self, prompts, config=None, **kw):
...         return [[Generation(p, [1], [p], [-0.5], "eos")] for p in prompts]
...     def score(self, prompts, answers, **kw):
...         raise NotImplementedError
...     def render_prompt(self, prompt):
...         return prompt
>>> DecodingLoop(Echo()).run(["a", "b"], GenerationConfig()).generations[1][0].text
'b'
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gnll.backends.base import Generation, GenerationConfig, Model, StreamingModel
from gnll.backends.early import EarlyDecided
from gnll.backends.held import HeldText
from gnll.measures.early import EarlyDecision

__all__ = ["Decoded", "DecodingLoop", "EarlyGreedy", "EarlyStop", "Job", "PromptError"]

# The server's logger: a decoding failure is a served request's failure, and operators configure it.
log = logging.getLogger("gnll.serve")

#: Per prompt, per sequence, per answer token: the most likely alternatives ``{token: log-prob}``.
Alternatives = list[list[list[dict[str, float]]] | None]
#: One step's tokens of a job's rows: ``(prompt, sequence, token id, log-prob, alternatives)``.
StepTokens = list[tuple[int, int, int, float, dict[str, float] | None]]


class PromptError(ValueError):
    """A job's own prompt cannot be decoded (too long for the context); the other jobs go on."""


@dataclass
class Job:
    """Prompts decoded together with one configuration, and where their answers go.

    Built by :meth:`DecodingLoop.job` (the one job site); the loop settles it once
    (:meth:`resolve` or :meth:`reject`), from the thread that decodes it.
    """

    prompts: list[str]
    config: GenerationConfig
    raw: bool
    #: Alternatives per answer token to report (``top_logprobs``); filled into :attr:`tops` per
    #: prompt and sequence before the job resolves.
    top_k: int = 0
    #: Exact early decisions (greedy jobs under refuse/escalate): a new
    #: :class:`~gnll.measures.early.EarlyDecision` per answer; a row stops once its rule decides.
    early: Callable[[], EarlyDecision] | None = None
    tops: Alternatives | None = None
    #: Set when nobody waits for the answer any more (a stream's client went away): the loop
    #: drops the job's rows and gives their slots to others.
    cancelled: bool = False
    #: Hears each decoding step's tokens of the job's rows (a stream); ``None``: nobody listens.
    listen: Callable[[StepTokens], None] | None = None
    #: Called once the job is settled (its owner hands the outcome over, e.g. to an event loop).
    on_settle: Callable[[Job], None] | None = None
    #: Its generations or its failure, once settled.
    outcome: tuple[list[list[Generation]] | None, BaseException | None] | None = None

    def resolve(self, value: list[list[Generation]]) -> None:
        self.outcome = (value, None)
        if self.on_settle is not None:
            self.on_settle(self)

    def reject(self, exc: BaseException) -> None:
        self.outcome = (None, exc)
        if self.on_settle is not None:
            self.on_settle(self)

    def result(self) -> list[list[Generation]]:
        """Its generations (its failure raised)."""
        assert self.outcome is not None, "the decoding loop settles every job it took"
        value, exc = self.outcome
        if exc is not None:
            raise exc
        assert value is not None
        return value


@dataclass
class Decoded:
    """A job's generations (per prompt, per sequence) and, if asked for, each answer token's most
    likely alternatives (per prompt, per sequence, per token: ``{token text: log-prob}``). An
    answer stopped at its early decision says where (:attr:`Generation.early`)."""

    generations: list[list[Generation]]
    top_logprobs: Alternatives | None = None


class EarlyStop:
    """One greedy row's released answer and its running decision: a decoding loop's ``watch``.

    Tokens go through the stop-string hold-back (:class:`~gnll.backends.held.HeldText`, as a
    stream sends them); only released tokens reach the rule, so a token that a stop string later
    cuts off never counts.
    """

    def __init__(self, held: HeldText, rule: EarlyDecision, max_tokens: int) -> None:
        self.held, self.rule, self.max_tokens = held, rule, max_tokens

    def __call__(self, token: int, logprob: float) -> bool:
        self.rule.skip()
        for _, tokens, lps in self.held.push(token, logprob):
            self.rule.release(lps, tokens)
        return self.rule.decided

    def decided(self) -> EarlyDecided:
        """Where the answer stopped (once :attr:`rule` decided)."""
        d = self.rule.decision
        return EarlyDecided(
            decided_at_token=d.at_token or 0,
            tokens_generated=self.rule.generated,
            tokens_saved=self.max_tokens - self.rule.generated,
            action=d.action,
        )

    def generation(self) -> Generation:
        """The answer up to the decision's token (``decided_at_token``): its G-NLL is the one the
        rule decided on. Tokens released with it in one piece (a held-back whitespace token goes
        out with the next) lie after the decision and are not part of it, as in proxy mode."""
        held = self.held
        t = min(held.sent, self.rule.decision.at_token or 0)
        ids = held.ids[:t]
        text = held.text if t == held.sent else held.decode(ids)
        return Generation(
            text=text.strip(),
            token_ids=ids,
            tokens=[held.decode([i]) for i in ids],
            token_logprobs=[float(x) for x in held.logprobs[:t]],
            finish_reason="decided",
            # Decided before any answer token (a policy that abstains on G-NLL 0): its G-NLL is
            # the running sum, 0, not the empty-answer rule's stop token (none was generated).
            terminator_logprobs=[] if ids else [0.0],
            early=self.decided(),
        )


@dataclass
class _Open:
    """A job decoding in the loop: its generations so far and the prompts still going."""

    job: Job
    outputs: list[list[Generation] | None]
    left: int
    tops: Alternatives
    #: Per prompt, per sequence: the early-decision watches (jobs with early decisions only).
    watches: list[list[EarlyStop]] | None = None

    def decided(self, i: int, gens: list[Generation]) -> list[Generation]:
        """Prompt ``i``'s generations, those stopped at an early decision cut to what was
        released (each saying where: :attr:`Generation.early`)."""
        assert self.watches is not None
        return [
            w.generation() if w.rule.decided else gen
            for gen, w in zip(gens, self.watches[i], strict=True)
        ]


class DecodingLoop:
    """Decode jobs with ``model``: in its decoding loop when it has one, else by ``generate``.

    Parameters
    ----------
    model:
        Any gnll model.
    max_batch_prompts:
        Most prompts (rows / ``num_sequences``) decoded at once.
    """

    def __init__(self, model: Model, *, max_batch_prompts: int = 64) -> None:
        if max_batch_prompts < 1:
            raise ValueError(f"max_batch_prompts must be >= 1, got {max_batch_prompts}")
        self.model = model
        self.max_batch_prompts = int(max_batch_prompts)
        #: Whether the model has a decoding loop that prompts join while it runs.
        self.continuous = model.capabilities.streaming
        #: A reasoning model whose answers a decoding loop can stop (its own model has one): the
        #: trace is the model's own, the answer phase runs through :meth:`drive` with the watches.
        self.answerer: StreamingModel | None = model.answer_decoder()

    @property
    def reports_alternatives(self) -> bool:
        """Whether ``top_logprobs`` can be asked for (the continuous loop records them)."""
        return self.continuous

    @property
    def decides_early(self) -> bool:
        """Whether answers can stop at an early decision: the continuous decoding loop can, and a
        reasoning model's answer phase when its model has that loop (the trace runs to its end)."""
        return self.continuous or self.answerer is not None

    def job(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        top_k: int = 0,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> Job:
        """The one job site: ``prompts`` to decode with ``config`` (``raw``: no chat template),
        with ``top_k`` alternatives per answer token and, for greedy decoding where answers can
        stop (:attr:`decides_early`), ``early``'s rule per answer (dropped otherwise)."""
        if not self.decides_early or config.strategy != "greedy":
            early = None
        return Job(list(prompts), config, raw, top_k=int(top_k), early=early)

    def run(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> Decoded:
        """Decode ``prompts`` now, in the calling thread (``gnll generate --policy refuse``);
        ``early`` as in :meth:`job`."""
        job = self.job(prompts, config, raw=raw, early=early)
        if self.answerer is not None and job.early is not None:
            return Decoded(self.reason([job]))
        if not (self.continuous and self.drive_now(self.streaming, [job])):
            # no decoding loop (for this configuration): the model's generate
            return Decoded(self.generate(job.prompts, config, raw))
        return Decoded(job.result(), job.tops)

    @property
    def streaming(self) -> StreamingModel:
        return cast(StreamingModel, self.model)

    def open(self, config: GenerationConfig) -> Any:
        """A decoder for a group of jobs with ``config``, as wide as the largest group; ``None``
        when the model has no decoding loop (for this configuration)."""
        if not self.continuous:
            return None
        rows = self.max_batch_prompts * config.num_sequences
        return self.streaming.open_decoder(config, width=rows)

    def drive(
        self,
        lm: StreamingModel,
        decoder: Any,
        jobs: list[Job],
        more: Callable[[], list[Job]] | None = None,
    ) -> int:
        """The decoding loop: ``jobs`` (and those ``more`` hands over after each step) decode in
        ``decoder``, each answer stopping at its early decision where the job has rules, each job
        settled when its rows end; the number of prompts served."""
        served = 0
        open_jobs: dict[int, _Open] = {}
        numbers = itertools.count()

        def join(job: Job) -> None:
            nonlocal served
            try:
                ids = lm.encode(job.prompts, raw_prompt=job.raw)
                lm.check_context(ids, job.config.max_new_tokens)
            except ValueError as exc:  # this job's problem only (too long a prompt)
                job.reject(PromptError(str(exc)))
                return
            except Exception as exc:  # this job's problem only
                job.reject(exc)
                return
            # A seed per job: two unseeded jobs with the same prompt sample independently.
            seed = job.config.seed
            if job.config.strategy == "sample" and seed is None:
                seed = secrets.randbelow(2**31)
            if not ids:
                job.resolve([])
                return
            number = next(numbers)
            stops = lm.stop_rules(job.config.stop)
            watches: list[list[EarlyStop]] = []
            for i, row in enumerate(ids):
                watch = None
                if job.early is not None:
                    rows = [
                        EarlyStop(
                            HeldText(lm.decode, stops.token_ids, stops.strings),
                            job.early(),
                            job.config.max_new_tokens,
                        )
                        for _ in range(job.config.num_sequences)
                    ]
                    watches.append(rows)

                    def watch(j: int, token: int, lp: float, rows: list[EarlyStop] = rows) -> bool:
                        return rows[j](token, lp)

                decoder.add(
                    (number, i),
                    row,
                    seed=seed,
                    max_new_tokens=job.config.max_new_tokens,
                    stops=stops,
                    watch=watch,
                )
            open_jobs[number] = _Open(
                job, [None] * len(ids), len(ids), [None] * len(ids), watches or None
            )
            decoder.top_k = max(decoder.top_k, job.top_k)
            served += len(ids)
            if job.listen is not None:  # the loop reports its tokens only when someone listens
                decoder.on_token = heard

        def heard(tokens: list[tuple[Any, int, int, float, dict[str, float] | None]]) -> None:
            # One hand-off per listening job and step: a stream wakes once per chunk batch.
            per_job: dict[int, StepTokens] = {}
            for (jid, i), j, token, lp, alts in tokens:
                if jid in open_jobs and open_jobs[jid].job.listen is not None:
                    per_job.setdefault(jid, []).append((i, j, token, lp, alts))
            for jid, items in per_job.items():
                listen = open_jobs[jid].job.listen
                assert listen is not None  # only listening jobs got items
                listen(items)

        for job in jobs:
            join(job)
        while decoder.busy:
            try:
                finished = decoder.step()
            except Exception as exc:  # delivered to every job in the loop; the caller lives on
                log.exception("decoding failed with %d requests in flight", len(open_jobs))
                for failed in open_jobs.values():
                    failed.job.reject(exc)
                break
            for (jid, i), gens in finished:
                entry = open_jobs.get(jid)
                if entry is None:  # cancelled meanwhile
                    continue
                if entry.watches is not None:
                    gens = entry.decided(i, gens)
                entry.outputs[i], entry.left = gens, entry.left - 1
                tops = decoder.top_logprobs.pop((jid, i), None)
                if tops is not None:  # one list per answer token (a decided answer is cut)
                    tops = [alts[: len(g.token_ids)] for alts, g in zip(tops, gens, strict=True)]
                entry.tops[i] = tops
                if entry.left == 0:
                    if entry.job.top_k:
                        entry.job.tops = entry.tops
                    done = open_jobs.pop(jid).outputs
                    entry.job.resolve(cast(list[list[Generation]], done))
            for jid in [jid for jid, entry in open_jobs.items() if entry.job.cancelled]:
                # Nobody waits for it: its rows leave the loop and their slots go to others.
                for i in range(len(open_jobs.pop(jid).outputs)):
                    decoder.cancel((jid, i))
            for job in more() if more is not None else []:
                join(job)
        return served

    def drive_now(self, lm: StreamingModel, jobs: list[Job]) -> bool:
        """Decode ``jobs`` (one configuration) through :meth:`drive`, in a decoder as wide as
        they need; ``False`` (nothing done) when ``lm`` has no decoding loop for their
        configuration."""
        config = jobs[0].config
        prompts = sum(len(job.prompts) for job in jobs)
        width = max(1, min(prompts, self.max_batch_prompts)) * config.num_sequences
        decoder = lm.open_decoder(config, width=width)
        if decoder is None:
            return False
        self.drive(lm, decoder, jobs)
        return True

    def call(self, jobs: list[Job]) -> list[list[Generation]]:
        """The generations of ``jobs`` (one configuration) from one call of the model, in order:
        ``generate``, or for a reasoning model with early decisions :meth:`reason`."""
        if self.answerer is not None and any(job.early for job in jobs):
            return self.reason(jobs)
        prompts = [p for job in jobs for p in job.prompts]
        return self.generate(prompts, jobs[0].config, jobs[0].raw)

    def reason(self, jobs: list[Job]) -> list[list[Generation]]:
        """A reasoning model's answers to ``jobs`` (one configuration), each answer stopping at its
        job's early decision: the traces are decoded to their end (the decision cannot be made
        before the answer starts), the answer phase runs through :meth:`drive` with the
        watches, so only answer tokens, released after the end-of-reasoning marker, count."""
        model = self.model
        lm = self.answerer
        assert lm is not None
        config, raw = jobs[0].config, jobs[0].raw

        def answer(contexts: list[str], cfg: GenerationConfig) -> list[list[Generation]]:
            parts, start = [], 0
            for job in jobs:  # one part per job: each keeps its own rule
                parts.append(
                    self.job(
                        contexts[start : start + len(job.prompts)], cfg, raw=True, early=job.early
                    )
                )
                start += len(job.prompts)
            if not self.drive_now(lm, parts):  # no loop for this configuration: to the end
                return cast(Model, lm).generate(contexts, cfg, raw_prompt=True)
            outs = []
            for part in parts:
                outs += part.result()
            return outs

        prompts = [p for job in jobs for p in job.prompts]
        return model.generate_answers(
            prompts, config, answer, raw_prompt=raw and model.capabilities.chat
        )

    def generate(
        self, prompts: list[str], config: GenerationConfig, raw: bool
    ) -> list[list[Generation]]:
        """The model's ``generate`` (a sampled call without a seed gets one of its own)."""
        if config.strategy == "sample" and config.seed is None:
            config = config.replace(seed=secrets.randbelow(2**31))
        if raw and self.model.capabilities.chat:  # a model without a template renders verbatim
            return self.model.generate(prompts, config, raw_prompt=True)
        return self.model.generate(prompts, config)


class EarlyGreedy:
    """``model`` whose greedy answers stop at an exact early decision (:mod:`gnll.measures.early`),
    decoded in the calling thread through :class:`DecodingLoop`.

    An answer ends at the first released token after which ``rule``'s policy refuses it whatever
    follows; the answer returned is the part released then (``finish_reason`` ``"decided"``,
    :attr:`~gnll.backends.base.Generation.early` saying where). Everything else is the model's
    own. Built by :func:`gnll.scoring.generating.early_greedy`, which checks that answers can stop.
    """

    def __init__(self, loop: DecodingLoop, rule: Callable[[], EarlyDecision]) -> None:
        self.loop, self.model, self.rule = loop, loop.model, rule
        #: which tokens its G-NLL covers, the model's own (a calibration is checked against it)
        self.scored = loop.model.scored

    def __getattr__(self, name: str) -> object:  # the rest of the Model: the model's own
        return getattr(self.model, name)

    def generate(
        self, prompts: Sequence[str], config: GenerationConfig | None = None, **kw: Any
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        if config.strategy != "greedy" or config.num_sequences != 1:
            return self.model.generate(prompts, config, **kw)
        # The server's decoding loop, run here: one loop stops answers at their decisions.
        raw = kw.get("raw_prompt", False)
        return self.loop.run(prompts, config, raw=raw, early=self.rule).generations
