"""Dynamic batching: concurrent requests share the in-process model's forward passes.

The model runs in one worker thread; the asyncio event loop only enqueues work and awaits futures,
so it never blocks on a forward pass. Only requests with the same
:class:`~gnll.backends.base.GenerationConfig` can share forward passes; the worker serves the
oldest request's group first and leaves the others queued (no starvation). The decoding itself is
the library's decoding loop (:class:`gnll.backends.decoding.DecodingLoop`, which ``gnll generate``
runs too); this module is its queue, its worker thread and the hand-over to asyncio. Two ways:

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
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gnll.backends.base import Generation, GenerationConfig, Model
from gnll.backends.decoding import Decoded, DecodingLoop, Job, PromptError
from gnll.measures.early import EarlyDecision
from gnll.serving.errors import RequestError

__all__ = ["BatchingEngine", "Decoded", "EngineStopped"]

log = logging.getLogger("gnll.serve")


@dataclass
class _Ticket:
    """A queued job and how its outcome reaches the event loop that waits for it."""

    job: Job
    key: tuple[GenerationConfig, bool | None, str | None]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[list[Generation]]]
    enqueued: float = field(default_factory=time.perf_counter)
    #: Streaming jobs: ``("tokens", [(prompt, j, token_id, log-prob, alts), ...])`` per step,
    #: then ``("done", generations)`` or ``("error", exception)``.
    events: asyncio.Queue[tuple[str, Any]] | None = None

    def settled(self, job: Job) -> None:
        """The job is settled (in the worker thread): its outcome goes to the event loop."""
        assert job.outcome is not None
        value, exc = job.outcome
        if isinstance(exc, PromptError):  # this request's prompt: a 400 naming it
            exc = RequestError(str(exc), "prompt")
        self.loop.call_soon_threadsafe(_settle, self, value, exc)

    def heard(self, items: list[tuple[int, int, int, float, dict[str, float] | None]]) -> None:
        assert self.events is not None
        self.loop.call_soon_threadsafe(self.events.put_nowait, ("tokens", items))


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
        #: The decoding loop the worker runs (``gnll generate`` runs the same).
        self.decoding = DecodingLoop(model, max_batch_prompts=max_batch_prompts)
        self.model = model
        self.max_batch_prompts = self.decoding.max_batch_prompts
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.wait_fraction = max(0.0, float(wait_fraction))
        self._expect = 1
        self._free_since = 0.0
        self._last_seconds = 0.0
        self.on_batch = on_batch
        self._queue: deque[_Ticket] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._continuous = self.decoding.continuous
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
        :attr:`decides_early`), and its :attr:`Generation.early` says where.
        """
        if top_logprobs and not self._continuous:
            raise RequestError("this model reports no alternatives (top_logprobs)", "top_logprobs")
        ticket = self._enqueue(prompts, config, raw, stream=False, top_k=top_logprobs, early=early)
        try:
            gens = await ticket.future
        except asyncio.CancelledError:  # the request's task was cancelled: free its rows
            ticket.job.cancelled = True
            raise
        return Decoded(gens, ticket.job.tops)

    @property
    def decides_early(self) -> bool:
        """Whether answers can stop at an early decision (:attr:`DecodingLoop.decides_early`)."""
        return self.decoding.decides_early

    def run(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        *,
        raw: bool = False,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> Decoded:
        """Decode ``prompts`` now, in the calling thread, through the loop that serves requests
        (:meth:`DecodingLoop.run`); ``early`` as in :meth:`decode`.

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
        return self.decoding.run(prompts, config, raw=raw, early=early)

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
        return _events(self._enqueue(prompts, config, raw, stream=True, top_k=top_logprobs))

    def _enqueue(
        self,
        prompts: Sequence[str],
        config: GenerationConfig,
        raw: bool,
        *,
        stream: bool,
        top_k: int = 0,
        early: Callable[[], EarlyDecision] | None = None,
    ) -> _Ticket:
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
        job = self.decoding.job(prompts, config, raw=raw, top_k=top_k, early=early)
        ticket = _Ticket(job, key, loop, loop.create_future())
        job.on_settle = ticket.settled
        if stream:
            ticket.events = asyncio.Queue()
            job.listen = ticket.heard
        with self._cond:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            self._queue.append(ticket)
            self._cond.notify()
        return ticket

    # ------------------------------------------------------------------ worker
    def _take_batch(self) -> list[_Ticket] | None:
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
                and sum(len(t.job.prompts) for t in self._queue) < expect
                and (left := deadline - time.perf_counter()) > 0
            ):
                self._cond.wait(left)
            self._queue = deque(t for t in self._queue if not t.job.cancelled)
            if not self._queue:
                return [] if not self._stopping else None
            key = self._queue[0].key
            batch: list[_Ticket] = []
            rest: deque[_Ticket] = deque()
            size = 0
            for ticket in self._queue:
                n = len(ticket.job.prompts)
                if ticket.key == key and (not batch or size + n <= self.max_batch_prompts):
                    batch.append(ticket)
                    size += n
                else:
                    rest.append(ticket)
            self._queue = rest
            return batch

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue
            decoder = self.decoding.open(batch[0].job.config)
            if decoder is not None:
                self._run_continuous(decoder, batch)
            else:
                self._run_call(batch)

    def _run_continuous(self, decoder: Any, batch: list[_Ticket]) -> None:
        """Decode the group of ``batch[0]``: jobs of the same group that queue meanwhile join it
        (up to the first job of another group, which runs next), each answered when done."""
        key, started = batch[0].key, time.perf_counter()

        def more() -> list[Job]:
            with self._cond:
                joining = []
                while self._queue and self._queue[0].key == key:
                    ticket = self._queue.popleft()
                    if not ticket.job.cancelled:
                        joining.append(ticket.job)
            return joining

        loop = self.decoding
        served = loop.drive(loop.streaming, decoder, [t.job for t in batch], more)
        self.batches += 1
        elapsed = time.perf_counter() - started
        self._last_seconds, self._free_since = elapsed, time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(served, elapsed)

    def _run_call(self, batch: list[_Ticket]) -> None:
        jobs = [t.job for t in batch]
        prompts = sum(len(job.prompts) for job in jobs)
        started = time.perf_counter()
        try:
            outs = self.decoding.call(jobs)
        except Exception as exc:  # delivered to every waiting request, the worker lives on
            log.exception("generate failed for a batch of %d prompts", prompts)
            for job in jobs:
                job.reject(exc)
            return
        elapsed = time.perf_counter() - started
        self.batches += 1
        with self._cond:
            queued = sum(len(t.job.prompts) for t in self._queue)
        self._expect, self._last_seconds = queued + prompts, elapsed
        self._free_since = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(prompts, elapsed)
        start = 0
        for job in jobs:
            job.resolve(outs[start : start + len(job.prompts)])
            start += len(job.prompts)


def _settle(ticket: _Ticket, value: Any, exc: BaseException | None) -> None:
    """Resolve a job's future (and end its event stream), on the job's event loop."""
    if ticket.future.done():
        return
    if exc is not None:
        ticket.future.set_exception(exc)
    else:
        ticket.future.set_result(value)
    if ticket.events is not None:
        ticket.future.exception()  # read here: a stream reports it through its queue instead
        ticket.events.put_nowait(("error", exc) if exc is not None else ("done", value))


async def _events(ticket: _Ticket) -> AsyncGenerator[tuple[str, Any], None]:
    try:
        while True:
            assert ticket.events is not None, "a streaming job has its event queue"
            kind, value = await ticket.events.get()
            if kind == "error":
                raise value
            yield kind, value
            if kind == "done":
                return
    finally:
        # Closed before the end (the client went away): nobody waits for the rest.
        if not ticket.future.done():
            ticket.job.cancelled = True
            ticket.future.cancel()
