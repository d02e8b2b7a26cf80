"""gnll's decoding loop: greedy decoding and sampling with continuous batching.

The loop (:meth:`Decoder.step`) reads like any sampling loop -- choose a token, record its log-probs,
check for stops, run the model on the new token -- with each job in a small piece:
:class:`~.selection.StepScores` chooses and scores tokens, :class:`~.stopping.StopRules` says which
rows ended, :class:`Slots` keeps the batch (its rows, mask, positions and KV cache). A finished row
frees its slot; a waiting prompt takes it (continuous batching), so a batch does not decode at a
fraction of its width while its last rows finish. When nothing waits, finished rows leave the batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.hf.kv_cache import Prefix
from gnll.backends.hf.planning import COMPACT_FRACTION, MIN_SHARED_PREFIX, common_length
from gnll.backends.hf.prefill import Prefilled, Prefiller
from gnll.backends.hf.selection import StepScores, sample_uniforms
from gnll.backends.hf.stopping import StopRules


@dataclass
class _Prompt:
    """A prompt waiting for slots, with what may differ between the prompts of one loop."""

    tag: Hashable
    ids: list[int]
    prefix: Prefix | None
    seed: int | None
    config: GenerationConfig  # its own max_new_tokens and stop strings
    stops: StopRules
    #: Hears each of the prompt's new tokens, ``(j, token_id, raw log-prob)``, and answers whether
    #: row ``j`` is done now (an exact early decision, :mod:`gnll.measures.early`).
    watch: Callable[[int, int, float], bool] | None = None


@dataclass
class _Row:
    """One sequence being decoded: sample ``j`` of ``prompt``."""

    prompt: _Prompt
    j: int
    tokens: list[int] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    tempered: list[float] = field(default_factory=list)
    #: With :attr:`Decoder.top_k`: per step, the ``top_k`` most likely ``(token id, raw log-prob)``.
    tops: list[list[tuple[int, float]]] = field(default_factory=list)


class Slots:
    """The batch: per slot a row (or ``None`` when free), its mask, next position and KV cache.

    Parameters
    ----------
    engine:
        Runs the forward passes.
    refill:
        Whether new rows may enter free slots of a running batch (full-attention caches only: rows
        are written into the cache's own buffers). Without it a new batch starts only when every
        row of the last one has finished.
    """

    def __init__(self, engine: Prefiller, *, refill: bool) -> None:
        self.engine = engine
        self.refill = refill
        self.rows: list[_Row | None] = []
        self.cache = self.mask = self.next_pos = self.logits = self.uniforms = None

    def live(self) -> list[int]:
        return [s for s, r in enumerate(self.rows) if r is not None]

    def free(self) -> list[int]:
        return [s for s, r in enumerate(self.rows) if r is None]

    def admit(self, pre: Prefilled, rows: list[_Row], repeats: int, u: torch.Tensor | None) -> None:
        """Take prefilled prompts (each repeated ``repeats`` times, rows in that order) into the
        batch: as a new batch when no row is live, else into free slots."""
        logits = pre.logits[:, -1]
        mask, next_pos = pre.attention_mask, pre.position_ids[:, -1] + 1
        if repeats > 1:
            logits = logits.repeat_interleave(repeats, dim=0)
            mask = mask.repeat_interleave(repeats, dim=0)
            next_pos = next_pos.repeat_interleave(repeats, dim=0)
        if not self.live():
            # The prompt was prefilled once; its samples share copies of that cache.
            self.cache = pre.cache
            if repeats > 1:
                self.cache.batch_repeat_interleave(repeats)
            self.rows, self.mask, self.next_pos, self.logits = list(rows), mask, next_pos, logits
            self.uniforms = u
            return
        free = self.free()[: len(rows)]
        if len(free) < len(rows):  # the batch grows by the missing slots
            free += self._grow(len(rows) - len(free))
        width, length = self.mask.shape[1], mask.shape[1]
        if length > width:  # a longer prompt than the window: pad every slot on the left
            self._widen(length)
            width = length
        idx = torch.tensor(free, device=self.mask.device)
        for layer, new in zip(self.cache.layers, pre.cache.layers, strict=True):
            k, v = new.keys, new.values
            if repeats > 1:
                k, v = k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0)
            layer.write_rows(idx, k, v)
        self.mask[idx] = 0
        self.mask[idx, width - length :] = mask
        self.next_pos[idx] = next_pos
        self.logits[idx] = logits
        if u is not None:
            have, need = self.uniforms.shape[1], u.shape[1]
            if need > have:  # a prompt allowed more tokens: old rows never read the new columns
                self.uniforms = torch.nn.functional.pad(self.uniforms, (0, need - have), value=0.5)
            self.uniforms[idx, :need] = u
        for s, row in zip(free, rows, strict=True):
            self.rows[s] = row

    def _grow(self, more: int) -> list[int]:
        """``more`` new free slots at the end of the batch (one copy of the cache)."""
        for layer in self.cache.layers:
            layer.add_rows(more)
        self.mask = torch.cat([self.mask, self.mask.new_zeros((more, self.mask.shape[1]))])
        self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(more)])
        self.logits = torch.cat(
            [self.logits, self.logits.new_zeros((more, *self.logits.shape[1:]))]
        )
        if self.uniforms is not None:
            pad = self.uniforms.new_full((more, self.uniforms.shape[1]), 0.5)
            self.uniforms = torch.cat([self.uniforms, pad])
        new = list(range(len(self.rows), len(self.rows) + more))
        self.rows += [None] * more
        return new

    def _widen(self, width: int) -> None:
        """Zero columns on the left of every slot until the window is ``width`` wide."""
        for layer in self.cache.layers:
            layer.widen(width)
        extra = self.mask.new_zeros((len(self.rows), width - self.mask.shape[1]))
        self.mask = torch.cat([extra, self.mask], 1)

    def release(self, slots: Sequence[int]) -> None:
        for s in slots:
            self.rows[s] = None

    def step(self, chosen: torch.Tensor, *, keep_slots: bool) -> None:
        """Feed each slot's chosen token to the model; :attr:`logits` becomes the next step's.

        Finished rows stay (costing one position each per step) while ``keep_slots`` (prompts wait
        for them) or until they make up :data:`~.planning.COMPACT_FRACTION` of the live ones; then
        they all leave every tensor and the cache at once (one copy of the cache).
        """
        live = self.live()
        if not keep_slots and len(self.rows) - len(live) >= max(1, len(live) * COMPACT_FRACTION):
            idx = torch.tensor(live, device=self.mask.device)
            self.cache.batch_select_indices(idx)
            self.mask, self.next_pos, chosen = self.mask[idx], self.next_pos[idx], chosen[idx]
            if self.uniforms is not None:
                self.uniforms = self.uniforms[idx]
            self.rows = [self.rows[s] for s in live]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        self.logits = self.engine.forward(
            chosen[:, None], self.mask, self.next_pos[:, None], self.cache, 1
        )[:, -1]
        self.next_pos = self.next_pos + 1

    def trim(self) -> None:
        """Drop leading columns that no live row attends to (no copy; refilled batches only)."""
        live = self.live()
        if not self.refill or not live:
            return
        idx = torch.tensor(live, device=self.mask.device)
        first = int(self.mask[idx].argmax(dim=1).min())
        if first > 0:
            for layer in self.cache.layers:
                layer.trim(first)
            self.mask = self.mask[:, first:]


class Decoder:
    """Greedy decoding or sampling of prompts that may arrive while others decode.

    Prompts wait in a queue; :meth:`step` decodes one token for every live row and admits waiting
    prompts into free slots (a prompt's ``num_sequences`` samples take that many slots), so the
    batch stays ``width`` rows wide as long as prompts wait.

    Parameters
    ----------
    engine:
        The model's :class:`~.prefill.Prefiller`.
    config:
        The decoding of every prompt (greedy or sampling, temperature, sequences per prompt; not
        beams); a prompt may bring its own ``max_new_tokens`` and stop strings (:meth:`add`).
    stops:
        The stop rules of ``config.stop``.
    width:
        Rows decoded together.
    refill:
        Admit prompts into a running batch (needs a full-attention cache; see :class:`Slots`).
    """

    def __init__(
        self,
        engine: Prefiller,
        config: GenerationConfig,
        stops: StopRules,
        *,
        width: int,
        refill: bool = True,
    ) -> None:
        if config.strategy not in ("greedy", "sample"):
            raise ValueError(f"Decoder decodes greedily or samples, not {config.strategy!r}")
        self.engine, self.config, self.stops = engine, config, stops
        self.n = config.num_sequences
        self.width = max(int(width), self.n)
        self.sampling = config.strategy == "sample"
        self.slots = Slots(engine, refill=refill)
        self.waiting: deque[_Prompt] = deque()
        self.results: dict[Hashable, list[Generation | None]] = {}
        self._prefix: Prefix | None = None  # the last shared prefix computed (prefix caching)
        self._previous: list[int] | None = None  # the last admitted group's first prompt
        #: Sequences that have ended so far (progress reports count them).
        self.ended_rows = 0
        #: Hears each step's new tokens, ``[(tag, j, token_id, raw log-prob, alternatives), ...]``
        #: for every row that decoded one (the token that ends a row included), before the row's
        #: answer is cut; a server streams answers with it. ``alternatives``: the step's
        #: ``{token text: raw log-prob}`` as :attr:`top_logprobs` records them (``None`` when
        #: :attr:`top_k` is 0). ``None``: nothing to call.
        self.on_token: (
            Callable[[list[tuple[Hashable, int, int, float, dict[str, float] | None]]], None] | None
        ) = None
        #: Alternatives per position to record (OpenAI's ``top_logprobs``; 0: none). A finished
        #: prompt's are in :attr:`top_logprobs` under its tag, one list per sequence, one
        #: ``{token text: raw log-prob}`` per answer token.
        self.top_k = 0
        self.top_logprobs: dict[Hashable, list[list[dict[str, float]]]] = {}

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or bool(self.slots.live())

    def add(
        self,
        tag: Hashable,
        ids: list[int],
        prefix: Prefix | None = None,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        stops: StopRules | None = None,
        watch: Callable[[int, int, float], bool] | None = None,
    ) -> None:
        """Queue one encoded prompt; its generations are reported under ``tag``.

        ``prefix``: a shared prefix the prompt starts with (prefilled once for all prompts that
        bring it). ``seed``: its own sampling seed instead of the configuration's (a server gives
        every request one, so that two users asking the same question get independent samples).
        ``max_new_tokens``, ``stops``: its own limit and stop rules instead of the loop's.
        ``watch``: hears each new token of its rows, ``(j, token_id, raw log-prob)``; a row ends
        as soon as it returns ``True`` (its slot goes to the next prompt), with the tokens decoded
        so far (a server stops an answer whose refusal or escalation is already certain).
        """
        if tag in self.results:
            raise ValueError(f"prompt tag {tag!r} is already decoding")
        config = self.config
        if stops is not None or max_new_tokens is not None:
            config = config.replace(
                max_new_tokens=max_new_tokens or config.max_new_tokens,
                stop=stops.stop if stops is not None else config.stop,
            )
        seed = config.seed if seed is None else seed
        self.results[tag] = [None] * self.n
        self.waiting.append(_Prompt(tag, ids, prefix, seed, config, stops or self.stops, watch))

    def cancel(self, tag: Hashable) -> None:
        """Forget a prompt: out of the queue, or its rows out of the batch (their slots are free
        for the next prompts at once). A server calls it when a client goes away."""
        self.waiting = deque(p for p in self.waiting if p.tag != tag)
        self.results.pop(tag, None)
        self.top_logprobs.pop(tag, None)
        self.slots.release(
            [s for s, r in enumerate(self.slots.rows) if r is not None and r.prompt.tag == tag]
        )

    def _admit(self, free: int) -> None:
        take = []
        while self.waiting and (len(take) + 1) * self.n <= free:
            # Prompts prefilled together must bring the same shared prefix.
            if take and self.waiting[0].prefix is not take[0].prefix:
                break
            take.append(self.waiting.popleft())
        if not take:
            return
        steps = max(p.config.max_new_tokens for p in take)
        ids = [p.ids for p in take]
        prefix = take[0].prefix
        if prefix is None:
            prefix = self._reusable_prefix(ids, steps)
        pre = self.engine.prefill(ids, prefix, reserve=steps)
        rows = [_Row(p, j) for p in take for j in range(self.n)]
        u = None
        if self.sampling:
            u = torch.cat([sample_uniforms(p.seed, [p.ids], self.n, steps) for p in take])
            u = u.to(pre.logits.device)
        self.slots.admit(pre, rows, self.n, u)

    def _reusable_prefix(self, rows: list[list[int]], steps: int) -> Prefix | None:
        """Prefix caching for prompts that arrive over time (a server's few-shot or system prompt).

        The tokens these rows share with each other and with the previous admission's first prompt
        are the prefix. The last prefix computed serves, cut to the head the rows share with it (no
        forward pass: keys and values are causal), unless the rows share at least
        ``MIN_SHARED_PREFIX`` tokens more than that head; only then is a new prefix run (and kept).
        """
        candidates = rows if self._previous is None else [*rows, self._previous]
        self._previous = rows[0]
        limit = min(len(r) for r in rows) - 1  # every row keeps a query token
        shared = limit
        for r in candidates[1:]:
            shared = common_length(candidates[0], r, shared)
        if len(candidates) < 2:
            shared = 0
        found, last = None, self._prefix
        if last is not None:
            n = min(len(last.ids), limit)
            for r in rows:
                n = common_length(last.ids, r, n)
            if n >= MIN_SHARED_PREFIX and shared - n < MIN_SHARED_PREFIX:
                found = last if n == len(last.ids) else last.head(n)
        if found is None and shared >= MIN_SHARED_PREFIX:
            found = self.engine.shared_prefix(candidates)
        if found is not None and not self.engine.prefix_fits(found, rows, steps):
            return None
        if found is not None:
            self._prefix = found
        return found

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Generation]]]:
        """Decode one token for every live row (admitting prompts first if the batch is empty);
        the prompts whose every sequence has ended, with their generations."""
        slots = self.slots
        if not slots.live():
            self._admit(self.width)
            if not slots.live():
                return []
        scores = StepScores(slots.logits, self.config.temperature if self.sampling else 1.0)
        if self.sampling:
            at = torch.tensor(
                [len(r.tokens) if r is not None else 0 for r in slots.rows],
                device=slots.uniforms.device,
            )
            chosen = scores.sample(slots.uniforms[torch.arange(len(at)), at])
        else:
            chosen = scores.greedy()
        lp, lpt = scores.logprobs(chosen)
        # One host transfer per step for ids and one per log-prob kind.
        ids, lp = chosen.tolist(), lp.tolist()
        lpt = lpt.tolist() if lpt is not None else None
        tops = None
        if self.top_k:
            values, top_ids = torch.topk(slots.logits, min(self.top_k, slots.logits.shape[-1]))
            values = values - scores.lse[:, None]
            tops = [
                list(zip(i, v, strict=True))
                for i, v in zip(top_ids.tolist(), values.tolist(), strict=True)
            ]
        ended, going = [], []
        for s in slots.live():
            row = slots.rows[s]
            row.tokens.append(ids[s])
            row.raw.append(lp[s])
            if lpt is not None:
                row.tempered.append(lpt[s])
            if tops is not None:
                row.tops.append(tops[s])
            p = row.prompt
            decided = p.watch is not None and p.watch(row.j, ids[s], lp[s])
            if decided or ids[s] in p.stops.token_ids or len(row.tokens) == p.config.max_new_tokens:
                ended.append(s)
            else:
                going.append(s)
        if self.on_token is not None:
            heard = []
            for s in slots.live():
                row = slots.rows[s]
                alts = None
                if tops is not None:  # named as _finish names them: a stream's equal the answer's
                    alts = _named(tops[s], row.prompt.stops.tokenizer.decode)
                heard.append((row.prompt.tag, row.j, ids[s], lp[s], alts))
            self.on_token(heard)
        # Stop strings that span tokens ("Question:"): decode only the tails of rows still going.
        for stops in {
            id(slots.rows[s].prompt.stops): slots.rows[s].prompt.stops for s in going
        }.values():
            mine = [s for s in going if slots.rows[s].prompt.stops is stops]
            hits = stops.ended_by_text([slots.rows[s].tokens for s in mine])
            ended += [s for s, hit in zip(mine, hits, strict=True) if hit]
        done = self._finish([slots.rows[s] for s in ended])
        self.ended_rows += len(ended)
        slots.release(ended)
        if slots.live():
            wait = slots.refill and bool(self.waiting)
            slots.step(chosen, keep_slots=wait)
            # Room: free slots, and slots the batch may still grow by (it opened narrower).
            room = len(slots.free()) + max(0, self.width - len(slots.rows))
            if wait and room >= max(self.n, self.width * COMPACT_FRACTION):
                slots.trim()
                self._admit(room)
        return done

    def _finish(self, rows: list[_Row]) -> list[tuple[Hashable, list[Generation]]]:
        done = []
        for row in rows:
            p = row.prompt
            out = self.results[p.tag]
            tempered = np.asarray(row.tempered) if row.tempered else None
            out[row.j] = gen = p.stops.split(row.tokens, np.asarray(row.raw), tempered, p.config)
            if self.top_k:
                decode = p.stops.tokenizer.decode
                alts = self.top_logprobs.setdefault(p.tag, [[] for _ in range(self.n)])
                alts[row.j] = [_named(step, decode) for step in row.tops[: len(gen.token_ids)]]
            if all(g is not None for g in out):
                done.append((p.tag, self.results.pop(p.tag)))
        return done


def _named(step: list[tuple[int, float]], decode: Callable) -> dict[str, float]:
    """``{token text: log-prob}``, most likely first (the likelier keeps a text two ids share)."""
    out: dict[str, float] = {}
    for i, v in step:
        out.setdefault(decode([i]), v)
    return out


@torch.inference_mode()
def decode(
    engine: Prefiller,
    prompts: list[list[int]],
    config: GenerationConfig,
    prefix: Prefix | None,
    stops: StopRules,
    *,
    width: int | None = None,
    refill: bool = True,
    on_done: Callable[[float], None] | None = None,
) -> list[list[Generation]]:
    """Greedy decoding or sampling of encoded prompts, ``num_sequences`` per prompt, ``width``
    rows at a time (default: all at once).

    ``on_done`` hears how many prompts finished at each step (a finished sample counts 1/N).
    """
    n = config.num_sequences
    dec = Decoder(engine, config, stops, width=width or len(prompts) * n, refill=refill)
    for i, ids in enumerate(prompts):
        dec.add(i, ids, prefix)
    results: list[list[Generation]] = [[] for _ in prompts]
    reported = 0
    while dec.busy:
        for i, gens in dec.step():
            results[i] = gens
        if on_done is not None and dec.ended_rows > reported:
            # Progress in samples: every sequence that ended counts 1/N of its prompt.
            on_done((dec.ended_rows - reported) / n)
            reported = dec.ended_rows
    return results


def refillable(engine: Prefiller) -> bool:
    """Whether prompts can join a running batch of this model: only with full attention, whose
    layers are all :class:`~.kv_cache.GrowingLayer` (a sliding window counts columns, which the
    padding of a joining row would shift)."""
    return engine.window is None
