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
from gnll.backends.hf.planning import COMPACT_FRACTION
from gnll.backends.hf.prefill import Prefilled, Prefiller
from gnll.backends.hf.selection import StepScores, sample_uniforms
from gnll.backends.hf.stopping import StopRules


@dataclass
class _Row:
    """One sequence being decoded: sample ``j`` of the prompt tagged ``tag``."""

    tag: Hashable
    j: int
    tokens: list[int] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    tempered: list[float] = field(default_factory=list)


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
        if len(free) < len(rows):
            raise ValueError(f"{len(rows)} rows do not fit {len(free)} free slots")
        width, length = self.mask.shape[1], mask.shape[1]
        if length > width:  # a longer prompt than the window: pad every slot on the left
            for layer in self.cache.layers:
                layer.widen(length)
            self.mask = torch.cat(
                [self.mask.new_zeros((len(self.rows), length - width)), self.mask], 1
            )
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
            self.uniforms[idx] = u
        for s, row in zip(free, rows, strict=True):
            self.rows[s] = row

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
        One configuration for every prompt (greedy or sampling; not beams).
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
        self.waiting: deque[tuple[Hashable, list[int], Prefix | None]] = deque()
        self.results: dict[Hashable, list[Generation | None]] = {}
        #: Sequences that have ended so far (progress reports count them).
        self.ended_rows = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or bool(self.slots.live())

    def add(self, tag: Hashable, ids: list[int], prefix: Prefix | None = None) -> None:
        """Queue one encoded prompt; its generations are reported under ``tag``. ``prefix``: a
        shared prefix it starts with (prefilled once for all prompts that bring it)."""
        if tag in self.results:
            raise ValueError(f"prompt tag {tag!r} is already decoding")
        self.results[tag] = [None] * self.n
        self.waiting.append((tag, ids, prefix))

    def _admit(self, free: int) -> None:
        take = []
        while self.waiting and (len(take) + 1) * self.n <= free:
            # Prompts prefilled together must bring the same shared prefix.
            if take and self.waiting[0][2] is not take[0][2]:
                break
            take.append(self.waiting.popleft())
        if not take:
            return
        ids = [t[1] for t in take]
        pre = self.engine.prefill(ids, take[0][2], reserve=self.config.max_new_tokens)
        rows = [_Row(tag, j) for tag, _, _ in take for j in range(self.n)]
        u = None
        if self.sampling:
            u = sample_uniforms(self.config.seed, ids, self.n, self.config.max_new_tokens)
            u = u.to(pre.logits.device)
        self.slots.admit(pre, rows, self.n, u)

    def step(self) -> list[tuple[Hashable, list[Generation]]]:
        """Decode one token for every live row (admitting prompts first if the batch is empty);
        the prompts whose every sequence has ended, with their generations."""
        slots, cfg = self.slots, self.config
        if not slots.live():
            self._admit(self.width)
            if not slots.live():
                return []
        scores = StepScores(slots.logits, cfg.temperature if self.sampling else 1.0)
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
        ended, going = [], []
        for s in slots.live():
            row = slots.rows[s]
            row.tokens.append(ids[s])
            row.raw.append(lp[s])
            if lpt is not None:
                row.tempered.append(lpt[s])
            if ids[s] in self.stops.token_ids or len(row.tokens) == cfg.max_new_tokens:
                ended.append(s)
            else:
                going.append(s)
        # Stop strings that span tokens ("Question:"): decode only the tails of rows still going.
        hits = self.stops.ended_by_text([slots.rows[s].tokens for s in going])
        ended += [s for s, hit in zip(going, hits, strict=True) if hit]
        done = self._finish([slots.rows[s] for s in ended])
        self.ended_rows += len(ended)
        slots.release(ended)
        if slots.live():
            wait = slots.refill and bool(self.waiting)
            slots.step(chosen, keep_slots=wait)
            free = len(slots.free())
            if wait and free >= max(self.n, self.width * COMPACT_FRACTION):
                slots.trim()
                self._admit(free)
        return done

    def _finish(self, rows: list[_Row]) -> list[tuple[Hashable, list[Generation]]]:
        done = []
        for row in rows:
            out = self.results[row.tag]
            tempered = np.asarray(row.tempered) if row.tempered else None
            out[row.j] = self.stops.split(row.tokens, np.asarray(row.raw), tempered, self.config)
            if all(g is not None for g in out):
                done.append((row.tag, self.results.pop(row.tag)))
        return done


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
