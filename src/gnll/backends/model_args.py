"""What a built-in backend takes as ``model_args``, declared without importing the backend.

The CLI types ``--model_args`` values from these declarations (:func:`gnll.cli._args.model_kwargs`),
so that a process that loads no model (a Ray driver: the replicas load it) never imports the hf
backend, and with it torch and transformers, only to read its parameters. The hf backend's loader
and model take exactly these keys (``tests/backends/test_backend_registry.py`` holds the two
together).
"""

from __future__ import annotations

from typing import Literal, TypedDict

__all__ = ["BeamDecoderName", "DecoderName", "HFModelArgs"]

#: How the hf backend decodes (``auto``: its own loop where the model's cache allows it).
DecoderName = Literal["auto", "loop", "generate"]
#: How the hf backend runs beam search.
BeamDecoderName = Literal["loop", "generate"]


class HFModelArgs(TypedDict, total=False):
    """``model_args`` of the ``hf`` backend: loading (``HFModel.from_pretrained``) and decoding
    (``HFModel``) parameters."""

    device: str
    dtype: str
    revision: str | None
    trust_remote_code: bool
    gguf_file: str | None
    fast_tokenizer: bool
    chat_template: bool | None
    batch_size: int
    max_batch_tokens: int | None
    decoder: DecoderName
    beam_decoder: BeamDecoderName
    continuous_batching: bool
