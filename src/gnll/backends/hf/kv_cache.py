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
    ``reserve`` more tokens and exposes ``keys``/``values`` as views of its filled part. Anything
    that replaces them (dropping finished rows, beam reordering, repeating rows) leaves a tensor
    that is not a view of the buffer, and the next update starts a new buffer from it.
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = max(0, int(reserve))
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        have = self.get_seq_length()
        new = key_states.shape[-2]
        buf = self._kbuf
        if (
            have == 0
            or not self._owns_buffer()
            or buf.shape[0] != key_states.shape[0]
            or have + new > buf.shape[-2]
        ):
            b, h, _, d = key_states.shape
            cap = have + new + max(self.reserve, (have + new) // 2 if buf is not None else 0)
            kbuf = key_states.new_empty((b, h, cap, d))
            vbuf = value_states.new_empty((b, value_states.shape[1], cap, value_states.shape[-1]))
            if have:
                kbuf[:, :, :have] = self.keys
                vbuf[:, :, :have] = self.values
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[:, :, have : have + new] = key_states
        self._vbuf[:, :, have : have + new] = value_states
        self.keys = self._kbuf[:, :, : have + new]
        self.values = self._vbuf[:, :, : have + new]
        return self.keys, self.values

    def allocate(self, like: torch.Tensor, batch: int, length: int) -> None:
        """Make ``keys``/``values`` uninitialised ``batch x heads x length x dim`` views to fill."""
        self.lazy_initialization(like, like)
        b, h, _, d = like.shape
        self._kbuf = like.new_empty((batch, h, length + self.reserve, d))
        self._vbuf = like.new_empty((batch, h, length + self.reserve, d))
        self.keys, self.values = self._kbuf[:, :, :length], self._vbuf[:, :, :length]

    def _owns_buffer(self) -> bool:
        return (
            self._kbuf is not None
            and self.is_initialized
            and self.keys.data_ptr() == self._kbuf.data_ptr()
            and self.values.data_ptr() == self._vbuf.data_ptr()
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # Selecting rows of the whole buffer is one copy and keeps the room reserved for the answer;
        # selecting the filled view would copy once here and once more at the next update.
        if not self._owns_buffer():
            return super().batch_select_indices(indices)
        have = self.get_seq_length()
        self._kbuf = self._kbuf[indices]
        self._vbuf = self._vbuf[indices]
        self.keys, self.values = self._kbuf[:, :, :have], self._vbuf[:, :, :have]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self._owns_buffer():
            return super().batch_repeat_interleave(repeats)
        have = self.get_seq_length()
        self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
        self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
        self.keys, self.values = self._kbuf[:, :, :have], self._vbuf[:, :, :have]


@dataclass
class Prefix:
    """Token ids shared by every prompt of a call and their KV cache (one row per layer)."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


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


def plain_cache(model: PreTrainedModel) -> bool:
    """Whether gnll's own cache handling can drive this model (plain attention KV caches only).

    The loop needs ``attention_mask``/``position_ids``/``past_key_values`` in ``forward`` and a
    cache whose layers can be copied, expanded and row-selected independently; recurrent states
    or chunked attention would not survive a padding hole or a row being dropped.
    """
    if model.config.is_encoder_decoder:
        return False
    params = set(inspect.signature(model.forward).parameters)
    if not {"attention_mask", "position_ids", "past_key_values"} <= params:
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
