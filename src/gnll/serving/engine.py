"""Dynamic batching: concurrent requests share the in-process model's forward passes.

The model runs in one worker thread; the asyncio event loop only enqueues work and awaits futures,
so it never blocks on a forward pass. Only requests with the same
:class:`~gnll.backends.base.GenerationConfig` can share forward passes; the worker serves the
oldest request's group first and leaves the others queued (no starvation). Two ways:

- **continuous** (a :class:`~gnll.backends.base.StreamingModel`, whose ``capabilities.streaming``
  says so: the hf backend): a
  request that arrives while the group decodes joins at the next step, taking the slots of rows
  that finished, and each request is answered as soon as its own rows end;
- **per call** (any other model): requests that arrive while a batch decodes wait in the queue and
  form the next ``generate`` call.

Examples
--------
>>> from gnll.backends.base import Generation, GenerationConfig, Model
>>> class Echo(Model):  # a stand-in model: answers each prompt with its own length
...     name = "echo"
...     def generate(self, prompts, config=None, **kw):
...         return [[Generation(str(len(p)), [1], ["x"], [-0.5], "eos")] for p in prompts]
...     def score(self, prompts, answers, **kw):
...         raise NotImplementedError
...     def render_prompt(self, prompt):
...         return prompt
>>> import asyncio
>>> async def main():
...     engine = BatchingEngine(Echo())
...     engine.start()
...     try:
...         outs = await asyncio.gather(*(engine.submit([p], GenerationConfig()) for p in ["a", "bb"]))
...     finally:
...         engine.stop()
...     return [o[0][0].text for o in outs]
>>> asyncio.run(main())
['1', '2']
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from gnll.backends.base import Generation, GenerationConfig, Model, StreamingModel
from gnll.measures.early import EarlyDecision
from gnll.serving.errors import RequestError
from gnll.serving.streams.live import HeldText

log = logging.getLogger("gnll.serve")


@dataclass
class _Job:
    prompts: list[str]
    config: GenerationConfig
    raw: bool
    key: tuple[GenerationConfig, bool | None, str | None]
    #: ``None`` (with ``future``): a job decoded in the calling thread (:meth:`BatchingEngine.run`),
    #: whose outcome waits in :attr:`outcome`.
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[list[list[Generation]]] | None
    enqueued: float = field(default_factory=time.perf_counter)
    #: Streaming jobs: ``("tokens", [(prompt, j, token_id, log-prob, alts), ...])`` per step,
    #: then ``("done", generations)`` or ``("error", exception)``.
    events: asyncio.Queue[tuple[str, Any]] | None = None
    #: Set (from the event loop) when nobody waits for the answer any more: the client of a stream
    #: went away. The worker drops the job from the queue or its rows from the decoding loop.
    cancelled: bool = False
    #: Alternatives per answer token to report (``top_logprobs``); filled into :attr:`tops` per
    #: prompt and sequence before the job resolves.
    top_k: int = 0
    tops: list[list[list[dict[str, float]]] | None] | None = None
    #: Exact early decisions (greedy jobs under refuse/escalate): a new
    #: :class:`~gnll.measures.early.EarlyDecision` per answer; a row stops once its rule decides.
    early: Callable[[], EarlyDecision] | None = None
    #: Per prompt, per sequence: the early decision's facts when one was made (else ``None``).
    decisions: list[list[dict[str, Any] | None]] | None = None
    #: A job decoded in the calling thread: its generations or its failure, once settled.
    outcome: tuple[list[list[Generation]] | None, BaseException | None] | None = None

    @classmethod
    def now(
        cls,
        prompts: Sequence[str],
        config: GenerationConfig,
        raw: bool,
        early: Callable[[], EarlyDecision] | None,
    ) -> _Job:
        """A job decoded in the calling thread (no event loop waits for it)."""
        job = cls(list(prompts), config, raw, (config, raw, None), None, None)
        job.early = early
        return job

    def resolve(self, value: Any) -> None:
        """Deliver the job's generations (from the worker thread)."""
        if self.loop is None:
            self.outcome = (value, None)
        else:
            self.loop.call_soon_threadsafe(_settle, self, value, None)

    def reject(self, exc: BaseException) -> None:
        """Deliver the job's failure (from the worker thread)."""
        if self.loop is None:
            self.outcome = (None, exc)
        else:
            self.loop.call_soon_threadsafe(_settle, self, None, exc)

    def result(self) -> list[list[Generation]]:
        """A job decoded in the calling thread: its generations (its failure raised)."""
        assert self.outcome is not None, "the decoding loop settles every job it took"
        value, exc = self.outcome
        if exc is not None:
            raise exc
        assert value is not None
        return value


@dataclass
class Decoded:
    """A job's generations (per prompt, per sequence) and, if asked for, each answer token's most
    likely alternatives (per prompt, per sequence, per token: ``{token text: log-prob}``)."""

    generations: list[list[Generation]]
    top_logprobs: list[list[list[dict[str, float]]] | None] | None = None
    #: Per prompt, per sequence: an early decision's facts (:class:`EarlyStop.facts`) when the
    #: answer was stopped at it, else ``None``; ``None`` for a job without early decisions.
    decisions: list[list[dict[str, Any] | None]] | None = None


class EarlyStop:
    """One greedy row's released answer and its running decision: a decoding loop's ``watch``.

    Tokens go through the stop-string hold-back (:class:`~gnll.serving.streams.live.HeldText`,
    as a stream sends them); only released tokens reach the rule, so a token that a stop string
    later cuts off never counts.
    """

    def __init__(self, held: HeldText, rule: EarlyDecision, max_tokens: int) -> None:
        self.held, self.rule, self.max_tokens = held, rule, max_tokens

    def __call__(self, token: int, logprob: float) -> bool:
        self.rule.skip()
        for _, tokens, lps in self.held.push(token, logprob):
            self.rule.release(lps, tokens)
        return self.rule.decided

    def facts(self) -> dict[str, Any]:
        d = self.rule.decision
        return {
            "decided_at_token": d.at_token,
            "tokens_generated": self.rule.generated,
            "tokens_saved": self.max_tokens - self.rule.generated,
            "action": d.action,
        }

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
        )


@dataclass
class _Open:
    """A job decoding in the continuous loop: its generations so far and the prompts still going."""

    job: _Job
    outputs: list[list[Generation] | None]
    left: int
    tops: list[list[list[dict[str, float]]] | None]
    #: Per prompt, per sequence: the early-decision watches (jobs with early decisions only).
    watches: list[list[EarlyStop]] | None = None
    decisions: list[list[dict[str, Any] | None]] = field(default_factory=list)

    def decided(self, i: int, gens: list[Generation]) -> list[Generation]:
        """Prompt ``i``'s generations, those stopped at an early decision cut to what was
        released; records the decisions."""
        assert self.watches is not None
        if not self.decisions:
            self.decisions = [[None] * len(w) for w in self.watches]
        out = []
        for j, (gen, w) in enumerate(zip(gens, self.watches[i], strict=True)):
            if w.rule.decided:
                self.decisions[i][j] = w.facts()
                gen = w.generation()
            out.append(gen)
        return out


class EngineStopped(RuntimeError):
    """The engine is shutting down and takes no new work."""


class BatchingEngine:
    """Serialise a :class:`~gnll.backends.base.Model` behind a queue that batches compatible requests.

    Parameters
    ----------
    model:
        Any gnll model (the hf backend for ``gnll serve --model``).
    max_batch_prompts:
        Most prompts (rows / ``num_sequences``) in one ``generate`` call.
    max_wait_ms:
        Upper bound on how long the first request of a batch waits for companions. The wait is
        adaptive: it ends as soon as the queue holds what was queued when the previous batch ended
        plus that batch's prompts (the clients whose answers just came back send their next request
        a few milliseconds later), and it never exceeds ``wait_fraction`` of the previous batch's
        duration, so it costs at most that fraction of latency. A lone client never waits.
    wait_fraction:
        See ``max_wait_ms``.
    on_batch:
        Called with (number of prompts, seconds) after every call (for metrics).
    """

    def __init__(
        self,
        model: Model,
        *,
        max_batch_prompts: int = 64,
        max_wait_ms: float = 200.0,
        wait_fraction: float = 0.05,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        if max_batch_prompts < 1:
            raise ValueError(f"max_batch_prompts must be >= 1, got {max_batch_prompts}")
        self.model = model
        self.max_batch_prompts = int(max_batch_prompts)
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.wait_fraction = max(0.0, float(wait_fraction))
        self._expect = 1
        self._free_since = 0.0
        self._last_seconds = 0.0
        self.on_batch = on_batch
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._continuous = model.capabilities.streaming
        #: A reasoning model whose answers a decoding loop can stop (its own model has one): the
        #: trace is the model's own, the answer phase runs through :meth:`_drive` with the watches.
        self._answerer: StreamingModel | None = None
        self._answerer = model.answer_decoder()
        self.batches = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gnll-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued job, then end the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ submitting
    @property
    def reports_alternatives(self) -> bool:
        """Whether ``top_logprobs`` can be asked for (the continuous decoding loop records them)."""
        return self._continuous

    async def submit(
        self, prompts: Sequence[str], config: GenerationConfig, *, raw: bool = False
    ) -> list[list[Generation]]:
        """Generate for ``prompts`` in some upcoming batch; ``raw`` skips the chat template."""
        return (await self.decode(prompts, config, raw=raw)).generations

    async def decode(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        top_logprobs: int = 0,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> Decoded:
        """Like :meth:`submit`, with the ``top_logprobs`` most likely alternatives per answer token
        (needs :attr:`reports_alternatives`).

        ``early``: makes one :class:`~gnll.measures.early.EarlyDecision` per answer (greedy
        decoding); an answer stops at the token where it decides (continuous decoding loop only:
        :attr:`decides_early`), and :attr:`Decoded.decisions` says where.
        """
        if top_logprobs and not self._continuous:
            raise RequestError("this model reports no alternatives (top_logprobs)", "top_logprobs")
        if not self.decides_early or config.strategy != "greedy":
            early = None
        job = self._enqueue(prompts, config, raw, stream=False, top_k=int(top_logprobs))
        job.early = early
        assert job.future is not None  # a queued job's
        try:
            gens = await job.future
        except asyncio.CancelledError:  # the request's task was cancelled: free its rows
            job.cancelled = True
            raise
        return Decoded(gens, job.tops, job.decisions)

    @property
    def decides_early(self) -> bool:
        """Whether answers can stop at an early decision: the continuous decoding loop can, and a
        reasoning model's answer phase when its model has that loop (the trace runs to its end)."""
        return self._continuous or self._answerer is not None

    def run(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> Decoded:
        """Decode ``prompts`` now, in the calling thread, through the loop that serves requests
        (batch jobs: ``gnll generate --policy refuse``); ``early`` as in :meth:`decode`.

        For an engine whose worker is not started (or from the worker itself): the two would
        share the model.

        Examples
        --------
        >>> from gnll.backends.base import Generation, GenerationConfig, Model
        >>> class Echo(Model):
        ...     name = "echo"
        ...     def generate(self, prompts, config=None, **kw):
        ...         return [[Generation(p, [1], [p], [-0.5], "eos")] for p in prompts]
        ...     def score(self, prompts, answers, **kw):
        ...         raise NotImplementedError
        ...     def render_prompt(self, prompt):
        ...         return prompt
        >>> BatchingEngine(Echo()).run(["a", "b"], GenerationConfig()).generations[1][0].text
        'b'
        """
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the engine's worker is running: submit work with decode()")
        if not self.decides_early or config.strategy != "greedy":
            early = None
        job = _Job.now(prompts, config, raw, early)
        if self._answerer is not None and early is not None:
            return Decoded(self._reason([job]), None, job.decisions)
        if not (self._continuous and self._drive_now(self._streaming, [job])):
            # no decoding loop (for this configuration): the model's generate
            return Decoded(self._generate(job.prompts, config, raw))
        return Decoded(job.result(), job.tops, job.decisions)

    def stream(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        top_logprobs: int = 0,
    ) -> AsyncGenerator[tuple[str, Any], None]:
        """Like :meth:`submit`, as events while decoding runs (called from the event loop).

        Yields ``("tokens", [(prompt, j, token_id, raw log-prob, alternatives), ...])`` once per
        decoding step of the job's rows (streaming models only; others decode a whole batch at
        once; ``alternatives``: the ``top_logprobs`` most likely tokens' log-probs, ``None``
        when none were asked for in the loop), then ``("done", generations)`` as :meth:`submit` returns them. Failures are raised
        from the iterator; :class:`EngineStopped` is raised here, before anything is queued.
        """
        job = self._enqueue(prompts, config, raw, stream=True, top_k=int(top_logprobs))
        return _events(job)

    def _enqueue(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        raw: bool,
        *,
        stream: bool,
        top_k: int = 0,
    ) -> _Job:
        loop = asyncio.get_running_loop()
        # Sampling with a client's seed is reproducible to the bit only alone in its batch (other
        # rows change the padding, which moves logits in the last digits and can flip a sampled
        # token), so such jobs get a key of their own.
        alone = config.strategy == "sample" and config.seed is not None
        key: tuple[GenerationConfig, bool | None, str | None] = (
            config,
            raw,
            secrets.token_hex(4) if alone else None,
        )
        if self._continuous:
            # One decoding loop takes prompts of any length limit, stop strings and rendering.
            key = (config.replace(max_new_tokens=1, stop=()), None, key[2])
        job = _Job(list(prompts), config, raw, key, loop, loop.create_future(), top_k=top_k)
        if stream:
            job.events = asyncio.Queue()
        with self._cond:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            self._queue.append(job)
            self._cond.notify()
        return job

    # ------------------------------------------------------------------ worker
    def _take_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            # Companions expected: what was already queued when the previous batch ended plus that
            # batch's own prompts (their clients are likely to return within milliseconds), so
            # groups of clients that got out of step merge again; waiting costs at most
            # wait_fraction of a batch's duration.
            expect = min(self.max_batch_prompts, self._expect)
            window = min(self.max_wait, self.wait_fraction * self._last_seconds)
            if self._continuous:
                window = 0.0  # companions join the running loop at its next step instead
            # From when the engine became free: requests that queued during the previous batch
            # have waited anyway; the window is for the clients that batch just answered.
            deadline = max(self._queue[0].enqueued, self._free_since) + window
            while (
                not self._stopping
                and sum(len(j.prompts) for j in self._queue) < expect
                and (left := deadline - time.perf_counter()) > 0
            ):
                self._cond.wait(left)
            self._queue = deque(j for j in self._queue if not j.cancelled)
            if not self._queue:
                return [] if not self._stopping else None
            key = self._queue[0].key
            batch: list[_Job] = []
            rest: deque[_Job] = deque()
            size = 0
            for job in self._queue:
                if job.key == key and (
                    not batch or size + len(job.prompts) <= self.max_batch_prompts
                ):
                    batch.append(job)
                    size += len(job.prompts)
                else:
                    rest.append(job)
            self._queue = rest
            return batch

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue
            decoder = self._decoder(batch[0])
            if decoder is not None:
                self._run_continuous(decoder, batch)
            else:
                self._run_call(batch)

    @property
    def _streaming(self) -> StreamingModel:
        return cast(StreamingModel, self.model)

    def _decoder(self, job: _Job) -> Any:
        if not self._continuous:
            return None
        rows = self.max_batch_prompts * job.config.num_sequences
        return self._streaming.open_decoder(job.config, width=rows)

    def _run_continuous(self, decoder: Any, batch: list[_Job]) -> None:
        """Decode the group of ``batch[0]``: jobs of the same group that queue meanwhile join it
        (up to the first job of another group, which runs next), each answered when done."""
        key, started = batch[0].key, time.perf_counter()

        def more() -> list[_Job]:
            with self._cond:
                joining = []
                while self._queue and self._queue[0].key == key:
                    job = self._queue.popleft()
                    if not job.cancelled:
                        joining.append(job)
            return joining

        served = self._drive(self._streaming, decoder, batch, more)
        self.batches += 1
        elapsed = time.perf_counter() - started
        self._last_seconds, self._free_since = elapsed, time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(served, elapsed)

    def _drive(
        self,
        lm: StreamingModel,
        decoder: Any,
        batch: list[_Job],
        more: Callable[[], list[_Job]] | None = None,
    ) -> int:
        """The decoding loop: ``batch``'s jobs (and those ``more`` hands over after each step)
        decode in ``decoder``, each answer stopping at its early decision where the job has
        rules, each job settled when its rows end; the number of prompts served.

        One loop for every caller: the server's continuous batching, :meth:`run` (batch jobs)
        and a reasoning model's answer phase (:meth:`_reason`)."""
        served = 0
        open_jobs: dict[int, _Open] = {}
        numbers = itertools.count()

        def join(job: _Job) -> None:
            nonlocal served
            try:
                ids = lm.encode(job.prompts, raw_prompt=job.raw)
                lm.check_context(ids, job.config.max_new_tokens)
            except ValueError as exc:  # this request's problem only (too long a prompt): a 400
                job.reject(RequestError(str(exc), "prompt"))
                return
            except Exception as exc:  # this request's problem only
                job.reject(exc)
                return
            # A seed per request: two unseeded requests with the same prompt sample independently.
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
            if job.events is not None:  # the loop reports its tokens only when someone listens
                decoder.on_token = heard

        def heard(tokens: list[tuple[Any, int, int, float, dict[str, float] | None]]) -> None:
            # One hand-off per streaming job and step: the event loop wakes once per chunk batch.
            per_job: dict[int, list[tuple[int, int, int, float, dict[str, float] | None]]] = {}
            for (jid, i), j, token, lp, alts in tokens:
                if jid in open_jobs and open_jobs[jid].job.events is not None:
                    per_job.setdefault(jid, []).append((i, j, token, lp, alts))
            for jid, items in per_job.items():
                job = open_jobs[jid].job
                # Only streaming jobs got items, and they are queued ones (with an event loop).
                assert job.events is not None and job.loop is not None
                job.loop.call_soon_threadsafe(job.events.put_nowait, ("tokens", items))

        for job in batch:
            join(job)
        while decoder.busy:
            try:
                finished = decoder.step()
            except Exception as exc:  # delivered to every request in the loop; the worker lives on
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
                    if entry.watches is not None:
                        entry.job.decisions = entry.decisions
                    open_jobs.pop(jid).job.resolve(entry.outputs)
            for jid in [jid for jid, entry in open_jobs.items() if entry.job.cancelled]:
                # Its client went away: its rows leave the loop and their slots go to others.
                for i in range(len(open_jobs.pop(jid).outputs)):
                    decoder.cancel((jid, i))
            for job in more() if more is not None else []:
                join(job)
        return served

    def _drive_now(self, lm: StreamingModel, jobs: list[_Job]) -> bool:
        """Decode ``jobs`` (one configuration) in the calling thread through :meth:`_drive`, in a
        decoder as wide as they need; ``False`` (nothing done) when ``lm`` has no decoding loop
        for their configuration."""
        config = jobs[0].config
        prompts = sum(len(job.prompts) for job in jobs)
        width = max(1, min(prompts, self.max_batch_prompts)) * config.num_sequences
        decoder = lm.open_decoder(config, width=width)
        if decoder is None:
            return False
        self._drive(lm, decoder, jobs)
        return True

    def _run_call(self, batch: list[_Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        started = time.perf_counter()
        try:
            if self._answerer is not None and any(job.early for job in batch):
                outs = self._reason(batch)
            else:
                outs = self._generate(prompts, batch[0].config, batch[0].raw)
        except Exception as exc:  # delivered to every waiting request, the worker lives on
            log.exception("generate failed for a batch of %d prompts", len(prompts))
            for job in batch:
                job.reject(exc)
            return
        elapsed = time.perf_counter() - started
        self.batches += 1
        with self._cond:
            queued = sum(len(j.prompts) for j in self._queue)
        self._expect, self._last_seconds = queued + len(prompts), elapsed
        self._free_since = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(len(prompts), elapsed)
        start = 0
        for job in batch:
            part = outs[start : start + len(job.prompts)]
            start += len(job.prompts)
            job.resolve(part)

    def _reason(self, jobs: list[_Job]) -> list[list[Generation]]:
        """A reasoning model's answers to ``jobs`` (one configuration), each answer stopping at its
        job's early decision: the traces are decoded to their end (the decision cannot be made
        before the answer starts), the answer phase runs through :meth:`_drive` with the
        watches, so only answer tokens, released after the end-of-reasoning marker, count.
        Sets each job's :attr:`_Job.decisions`."""
        model = self.model
        lm = self._answerer
        assert lm is not None
        config, raw = jobs[0].config, jobs[0].raw

        def answer(contexts: list[str], cfg: GenerationConfig) -> list[list[Generation]]:
            parts, start = [], 0
            for job in jobs:  # one part per request: each keeps its own rule
                parts.append(
                    _Job.now(contexts[start : start + len(job.prompts)], cfg, True, job.early)
                )
                start += len(job.prompts)
            if not self._drive_now(lm, parts):  # no loop for this configuration: to the end
                return cast(Model, lm).generate(contexts, cfg, raw_prompt=True)
            outs = []
            for job, part in zip(jobs, parts, strict=True):
                outs += part.result()
                job.decisions = part.decisions
            return outs

        prompts = [p for job in jobs for p in job.prompts]
        return model.generate_answers(
            prompts, config, answer, raw_prompt=raw and model.capabilities.chat
        )

    def _generate(
        self, prompts: list[str], config: GenerationConfig, raw: bool
    ) -> list[list[Generation]]:
        if config.strategy == "sample" and config.seed is None:
            config = config.replace(seed=secrets.randbelow(2**31))
        if raw and self.model.capabilities.chat:  # a model without a template renders verbatim
            return self.model.generate(prompts, config, raw_prompt=True)
        return self.model.generate(prompts, config)


def _settle(job: _Job, value: Any, exc: BaseException | None) -> None:
    """Resolve a job's future (and end its event stream), on the job's event loop."""
    assert job.future is not None  # only queued jobs are settled on an event loop
    if job.future.done():
        return
    if exc is not None:
        job.future.set_exception(exc)
    else:
        job.future.set_result(value)
    if job.events is not None:
        job.future.exception()  # read here: a stream reports it through its queue instead
        job.events.put_nowait(("error", exc) if exc is not None else ("done", value))


async def _events(job: _Job) -> AsyncGenerator[tuple[str, Any], None]:
    try:
        while True:
            assert job.events is not None, "a streaming job has its event queue"
            kind, value = await job.events.get()
            if kind == "error":
                raise value
            yield kind, value
            if kind == "done":
                return
    finally:
        # Closed before the end (the client went away): nobody waits for the rest.
        assert job.future is not None  # a streaming job is a queued one
        if not job.future.done():
            job.cancelled = True
            job.future.cancel()
