"""Prefill: running prompts into a KV cache, with the shared prefix once and rows in length groups.

Rows are laid out as ``[shared prefix | left padding | own suffix]``; with no shared prefix this is
ordinary left padding. Position ids count real tokens only, so the padding hole in the middle changes
nothing for the model (sliding windows: see :func:`~.kv_cache.fits_window`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from gnll.backends.hf.kv_cache import (
    GrowingLayer,
    Prefix,
    cache_argument,
    fits_window,
    initial_reserve,
    new_cache,
    sliding_window,
    with_prefix,
)
from gnll.backends.hf.planning import MIN_SHARED_PREFIX, common_length, prefill_groups


def pad_token_id(tokenizer: Any) -> int:
    """The id written into padding columns: the tokenizer's pad token, else its EOS token.

    Padding is always masked, so any id would do; gnll lays out padding itself (left, see
    :func:`left_padded`) rather than set ``pad_token``/``padding_side`` on a caller's tokenizer.
    """
    for i in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if i is not None:
            return int(i)
    return 0


def left_padded(
    rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``rows`` padded on the left to the longest row.

    Examples
    --------
    >>> ids, mask = left_padded([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    width = max((len(r) for r in rows), default=0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            input_ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return input_ids.to(device), mask.to(device)


@dataclass
class Prefilled:
    """A batch after its prompts went through the model: the layout, its cache and last logits."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    cache: DynamicCache
    logits: torch.Tensor | None


class Prefiller:
    """Forward passes of one model over gnll's cache layout.

    Parameters
    ----------
    model:
        A causal LM whose cache :func:`~.kv_cache.plain_cache` accepts.
    pad_token_id:
        Written into the padding columns (masked, never attended to).
    """

    def __init__(self, model: PreTrainedModel, pad_token_id: int) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.window = sliding_window(model)
        self.logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        #: ``forward``'s and ``generate``'s name for the KV cache (it changed in transformers 5.24).
        self.cache_arg = cache_argument(model) or "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cache: DynamicCache,
        keep: int,
    ) -> torch.Tensor:
        """One forward pass extending ``cache``; the float32 logits of the last ``keep`` columns."""
        kwargs: dict[str, Any] = {}
        if self.logits_to_keep:
            # Only the needed positions go through the LM head (a seq x vocab tensor otherwise).
            kwargs["logits_to_keep"] = keep
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_arg: cache},
            **kwargs,
        )
        # float32 models: .float() is a no-op, not a copy.
        return out.logits[:, -keep:].float()

    def prefix_fits(self, prefix: Prefix | None, rows: Sequence[Sequence[int]], extra: int) -> bool:
        """Whether ``rows`` (plus ``extra`` generated tokens) may use ``prefix`` exactly."""
        return prefix is not None and fits_window(self.window, max(len(r) for r in rows) + extra)

    @torch.inference_mode()
    def shared_prefix(self, rows: Sequence[Sequence[int]], cap: int | None = None) -> Prefix | None:
        """Run the tokens every row starts with through the model once (``None`` if not worth it).

        ``cap`` bounds the prefix length (scoring must keep each prompt's last token out of it). At
        least one token of every row always stays outside the prefix, so each row has a query.
        """
        if len(rows) < 2:
            return None
        first = rows[0]
        n = min(len(r) for r in rows) - 1
        if cap is not None:
            n = min(n, cap)
        for r in rows[1:]:
            n = common_length(first, r, n)
            if n < MIN_SHARED_PREFIX:
                return None
        ids = list(first[:n])
        cache = DynamicCache(config=self.model.config)
        self.forward(torch.tensor([ids], device=self.device), None, None, cache, keep=1)
        return Prefix(ids=ids, kv=[(layer.keys, layer.values) for layer in cache.layers])

    def prefill(
        self,
        rows: Sequence[Sequence[int]],
        prefix: Prefix | None,
        *,
        upto: int = 0,
        keep: int = 1,
        reserve: int = 0,
    ) -> Prefilled:
        """Lay out ``rows`` (shared prefix, padding hole, suffix) and run them into a KV cache.

        The last ``upto`` columns are left for the caller (``upto=1``: ``model.generate`` must see at
        least one new token); otherwise the logits of the last ``keep`` columns are returned. The
        cache leaves room for ``reserve`` generated tokens.
        """
        plen = len(prefix.ids) if prefix is not None else 0
        width = max(len(r) for r in rows)
        batch = len(rows)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        if plen:
            input_ids[:, :plen] = torch.tensor(prefix.ids)
            mask[:, :plen] = 1
        for i, row in enumerate(rows):
            suffix = row[plen:]
            input_ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[i, width - len(suffix) :] = 1
        # Positions count real tokens only (as transformers derives them from the mask).
        position_ids = (mask.cumsum(1) - 1).clamp_(min=0)
        input_ids, mask, position_ids = (t.to(self.device) for t in (input_ids, mask, position_ids))
        end = width - upto
        groups = prefill_groups([len(r) - plen for r in rows])
        if len(groups) > 1 and fits_window(self.window, width + reserve):
            cache, logits = self._grouped(
                groups, input_ids, mask, position_ids, prefix, end=end, keep=keep, reserve=reserve
            )
            return Prefilled(input_ids, mask, position_ids, cache, logits)
        cache = with_prefix(new_cache(self.model, initial_reserve(reserve)), prefix, batch)
        logits = None
        if end > plen:
            logits = self.forward(
                input_ids[:, plen:end], mask[:, :end], position_ids[:, plen:end], cache, keep=keep
            )
        return Prefilled(input_ids, mask, position_ids, cache, logits)

    def _grouped(
        self,
        groups: list[list[int]],
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        prefix: Prefix | None,
        *,
        end: int,
        keep: int,
        reserve: int,
    ) -> tuple[DynamicCache, torch.Tensor | None]:
        """Prefill rows group by group, each padded only to its own longest row, then assemble.

        Every group runs its own columns ``[width - w_g, end)`` (after the shared prefix, if any); its
        keys and values are copied into the batch layout at the same columns, and the columns a group
        did not run are padding (zero keys under a zero attention mask), exactly as in one big pass.
        """
        batch, width = input_ids.shape
        plen = len(prefix.ids) if prefix is not None else 0
        real = mask[:, plen:].sum(1).tolist()
        final = new_cache(self.model, initial_reserve(reserve))
        # Per layer, the (keys, values) of the whole batch: views of the final cache's own buffers
        # where it has them (no second copy), else tensors handed to the layer at the end.
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits = None
        for idx in groups:
            start = width - max(real[i] for i in idx)
            if end <= start:
                continue  # nothing of this group is run now (upto: the caller feeds the last token)
            rows = torch.tensor(idx, device=input_ids.device)
            cache = with_prefix(DynamicCache(config=self.model.config), prefix, len(idx))
            sub_mask = torch.cat([mask[rows, :plen], mask[rows, start:end]], dim=1)
            out = self.forward(
                input_ids[rows, start:end], sub_mask, position_ids[rows, start:end], cache, keep
            )
            if not targets:
                for layer, got in zip(final.layers, cache.layers, strict=True):
                    if isinstance(layer, GrowingLayer):
                        layer.allocate(got.keys, batch, end)
                        kv = (layer.keys, layer.values)
                    else:
                        kv = tuple(
                            t.new_empty((batch, t.shape[1], end, t.shape[3]))
                            for t in (got.keys, got.values)
                        )
                    for t, src in zip(kv, (got.keys, got.values), strict=True):
                        # Padding must be finite zeros: masked keys still enter q.k before the mask.
                        t[:, :, plen:].zero_()
                        if plen:
                            t[:, :, :plen] = src[:1, :, :plen]
                    targets.append(kv)
                logits = out.new_zeros((batch, keep, out.shape[-1]))
            for (kf, vf), layer in zip(targets, cache.layers, strict=True):
                kf[rows, :, start:end] = layer.keys[:, :, plen:]
                vf[rows, :, start:end] = layer.values[:, :, plen:]
            # A group narrower than ``keep`` returns fewer columns; rows are right-aligned, and the
            # columns it lacks lie in that group's padding, which no caller reads.
            logits[rows, keep - out.shape[1] :] = out
        if not targets:  # no group ran: the cache holds the prefix only, as in one big pass
            return with_prefix(final, prefix, batch), logits
        for layer, (k, v) in zip(final.layers, targets, strict=True):
            if not isinstance(layer, GrowingLayer):
                layer.update(k, v)
        return final, logits
