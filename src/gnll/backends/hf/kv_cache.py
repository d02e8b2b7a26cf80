"""The KV cache: growing full-attention layers, the shared prefix, and what the model's cache allows.

This is the only module that imports ``transformers.cache_utils``, so a cache refactor upstream
touches one file.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class GrowingLayer(DynamicLayer):
    """A full-attention KV cache layer that appends in place instead of re-concatenating.

    ``DynamicLayer`` rebuilds keys and values with ``torch.cat`` at every step, copying the whole
    cache (batch x prompt length) per layer and token. This layer keeps a buffer with room for
    ``reserve`` more tokens and exposes ``keys``/``values`` as views of a window of it. Anything
    that replaces them (beam reordering by another cache class, for instance) leaves a tensor that
    is not a view of the buffer, and the next update starts a new buffer from it.

    For continuous batching (:mod:`.decode`) the window can also lose leading columns without a
    copy (:meth:`trim`), take new rows into given batch slots (:meth:`write_rows`) and gain leading
    padding columns (:meth:`widen`).
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = max(0, int(reserve))
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._start = 0  # buffer column where the window (keys/values) begins

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        have = self.get_seq_length()
        new = key_states.shape[-2]
        if (
            have == 0
            or not self._owns_buffer()
            or self._kbuf.shape[0] != key_states.shape[0]
            or self._start + have + new > self._kbuf.shape[-2]
        ):
            grow = (have + new) // 2 if self._kbuf is not None else 0
            self._rebuffer(
                key_states.shape[0],
                have + new + max(self.reserve, grow),
                like=(key_states, value_states),
            )
        end = self._start + have
        self._kbuf[:, :, end : end + new] = key_states
        self._vbuf[:, :, end : end + new] = value_states
        self._show(self._start, end + new)
        return self.keys, self.values

    def _show(self, start: int, end: int) -> None:
        self._start = start
        self.keys = self._kbuf[:, :, start:end]
        self.values = self._vbuf[:, :, start:end]

    def _rebuffer(
        self,
        batch: int,
        cap: int,
        left: int = 0,
        like: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """A new buffer of ``cap`` columns holding the window after ``left`` zero columns."""
        have = self.get_seq_length()
        k, v = self.keys, self.values
        like_k, like_v = like if like is not None else (k, v)
        shape_k = (batch, like_k.shape[1], max(cap, left + have), like_k.shape[3])
        shape_v = (batch, like_v.shape[1], shape_k[2], like_v.shape[3])
        self._kbuf, self._vbuf = like_k.new_empty(shape_k), like_v.new_empty(shape_v)
        if left:
            # Padding must be finite zeros: masked keys still enter q.k before the mask.
            self._kbuf[:, :, :left].zero_()
            self._vbuf[:, :, :left].zero_()
        if have:
            self._kbuf[:, :, left : left + have] = k
            self._vbuf[:, :, left : left + have] = v
        self._show(0, left + have)

    def allocate(self, like: torch.Tensor, batch: int, length: int) -> None:
        """Make ``keys``/``values`` uninitialised ``batch x heads x length x dim`` views to fill."""
        self.lazy_initialization(like, like)
        b, h, _, d = like.shape
        self._kbuf = like.new_empty((batch, h, length + self.reserve, d))
        self._vbuf = like.new_empty((batch, h, length + self.reserve, d))
        self._show(0, length)

    def _owns_buffer(self) -> bool:
        if self._kbuf is None or not self.is_initialized:
            return False
        k, v = self._kbuf, self._vbuf
        at_k = k.data_ptr() + self._start * k.stride(2) * k.element_size()
        at_v = v.data_ptr() + self._start * v.stride(2) * v.element_size()
        return (
            self.keys.data_ptr() == at_k
            and self.values.data_ptr() == at_v
            and self.keys.shape[0] == k.shape[0]
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # Selecting rows of the buffer from the window on is one copy and keeps the room reserved
        # for the answer; selecting the filled view would copy once here and once more at the next
        # update.
        if not self._owns_buffer():
            return super().batch_select_indices(indices)
        have = self.get_seq_length()
        self._kbuf = self._kbuf[indices, :, self._start :]
        self._vbuf = self._vbuf[indices, :, self._start :]
        self._show(0, have)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self._owns_buffer():
            return super().batch_repeat_interleave(repeats)
        have = self.get_seq_length()
        self._kbuf = self._kbuf[:, :, self._start :].repeat_interleave(repeats, dim=0)
        self._vbuf = self._vbuf[:, :, self._start :].repeat_interleave(repeats, dim=0)
        self._show(0, have)

    # -------------------------------------------------------------- continuous batching
    def _own(self) -> None:
        if not self._owns_buffer():
            self._rebuffer(self.keys.shape[0], self.get_seq_length() + self.reserve)

    def trim(self, columns: int) -> None:
        """Drop the window's first ``columns`` columns (no copy: the buffer keeps them until it is
        next rebuilt)."""
        if columns > 0:
            self._own()
            self._show(self._start + columns, self._start + self.get_seq_length())

    def widen(self, width: int) -> None:
        """Give the window zero columns on the left until it is ``width`` columns wide (one copy)."""
        have = self.get_seq_length()
        if width > have:
            cap = width + max(self.reserve, width // 2)
            self._rebuffer(self.keys.shape[0], cap, left=width - have)

    def add_rows(self, count: int) -> None:
        """Append ``count`` batch rows of zeros (one copy of the buffer from the window on)."""
        if count > 0:
            self._own()
            have = self.get_seq_length()
            k, v = self._kbuf[:, :, self._start :], self._vbuf[:, :, self._start :]
            self._kbuf = torch.cat([k, k.new_zeros((count, *k.shape[1:]))])
            self._vbuf = torch.cat([v, v.new_zeros((count, *v.shape[1:]))])
            self._show(0, have)

    def write_rows(self, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put rows of another cache (``len(slots) x heads x length x dim``, length at most the
        window's) into batch ``slots``, right-aligned, with zero columns before them."""
        self._own()
        have, length = self.get_seq_length(), keys.shape[-2]
        if length > have:
            raise ValueError(f"rows of {length} columns do not fit a window of {have}: widen first")
        start, end = self._start, self._start + have
        self._kbuf[slots, :, start : end - length] = 0
        self._vbuf[slots, :, start : end - length] = 0
        self._kbuf[slots, :, end - length : end] = keys
        self._vbuf[slots, :, end - length : end] = values


@dataclass
class Prefix:
    """Token ids shared by every prompt of a call and their KV cache (one row per layer)."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    def head(self, n: int) -> Prefix:
        """The prefix of the first ``n`` tokens, without a forward pass: attention is causal, so
        their keys and values are the first ``n`` columns of this one's (views, no copy)."""
        return Prefix(self.ids[:n], [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv])


def with_prefix(cache: DynamicCache, prefix: Prefix | None, rows: int) -> DynamicCache:
    """Copy the shared prefix's keys/values into every one of ``rows`` rows of an empty ``cache``."""
    if prefix is not None:
        for layer, (k, v) in zip(cache.layers, prefix.kv, strict=True):
            layer.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
    return cache


#: Positions reserved up front for generated tokens; beyond them the cache grows by half its size
#: as needed, so ``max_new_tokens=6000`` for an 8-token answer does not hold 6000 positions per row.
INITIAL_RESERVE = 64


def initial_reserve(max_new_tokens: int) -> int:
    """Room to reserve for ``max_new_tokens`` generated tokens (the rest is grown on demand)."""
    return max(0, min(int(max_new_tokens), INITIAL_RESERVE))


def new_cache(model: PreTrainedModel, reserve: int = 0) -> DynamicCache:
    """The model's own cache layout, with in-place growing layers for full attention."""
    cache = DynamicCache(config=model.config)
    cache.layers = [
        GrowingLayer(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def cache_argument(model: PreTrainedModel) -> str | None:
    """The name under which ``model.forward`` (and ``generate``) take a KV cache: ``cache`` since
    transformers 5.24, ``past_key_values`` before (still accepted, deprecated, until 5.40);
    ``None`` if it takes neither."""
    params = inspect.signature(model.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def plain_cache(model: PreTrainedModel) -> bool:
    """Whether gnll's own cache handling can drive this model (plain attention KV caches only).

    The loop needs ``attention_mask``, ``position_ids`` and a cache argument
    (:func:`cache_argument`) in ``forward``, and a cache whose layers can be copied, expanded and
    row-selected independently; recurrent states or chunked attention would not survive a padding
    hole or a row being dropped.
    """
    if model.config.is_encoder_decoder:
        return False
    params = set(inspect.signature(model.forward).parameters)
    if not {"attention_mask", "position_ids"} <= params or cache_argument(model) is None:
        return False
    if hasattr(model, "_supports_default_dynamic_cache") and not (
        model._supports_default_dynamic_cache()
    ):
        return False
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # an exotic config that DynamicCache cannot read: use model.generate
        return False
    return bool(layers) and all(
        type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers
    )


def sliding_window(model: PreTrainedModel) -> int | None:
    """The smallest sliding attention window of the model's layers, if any."""
    windows = [
        layer.sliding_window
        for layer in DynamicCache(config=model.config).layers
        if isinstance(layer, DynamicSlidingWindowLayer)
    ]
    return min(windows) if windows else None


def fits_window(window: int | None, columns: int) -> bool:
    """Whether a layout of ``columns`` positions leaves every attention the model computes unchanged.

    Full attention (``window=None``) ignores a masked padding hole and keeps every column. A sliding
    window counts columns, so a hole between the shared prefix and a suffix would push real tokens
    out of it, and a sliding layer keeps only its last window of keys: shared prefixes and group-wise
    prefill are exact only when the whole sequence fits inside the window.

    >>> fits_window(None, 10**6), fits_window(512, 512), fits_window(512, 513)
    (True, True, False)
    """
    return window is None or columns <= window
