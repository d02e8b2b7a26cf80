"""Loading a checkpoint and its tokenizer, and deciding whether prompts get the chat template."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

#: Substrings that mark instruction-tuned checkpoints when the caller does not say.
INSTRUCT_MARKERS = ("instruct", "-it", "_it", "chat", "-sft", "dpo")


def load_tokenizer_json(directory: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """A fast tokenizer built directly from ``directory``'s ``tokenizer.json`` and special tokens.

    ``AutoTokenizer`` in transformers 5 re-parses ``tokenizer.json`` in Python and rebuilds
    model-specific tokenizer classes: 4.6 s for Gemma-3's 262k vocabulary, against 2 s for the
    Rust parser alone. Only for checkpoints whose ``tokenizer.json`` is the whole tokenizer (true
    for gnll's converted embedded models; ``tests/backends/test_backend_hf.py`` checks equal token ids).
    """
    from tokenizers import Tokenizer

    root = Path(directory)
    config_file = root / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    template = config.get("chat_template")
    if template is None and (root / "chat_template.jinja").exists():
        template = (root / "chat_template.jinja").read_text()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(root / "tokenizer.json")), **special
    )
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``"auto"`` is float32 on CPU and bfloat16 elsewhere; other names are torch dtypes."""
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return getattr(torch, dtype)
    except AttributeError as exc:
        raise ValueError(
            f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16"
        ) from exc


def load_pretrained(
    name_or_path: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    fast_tokenizer: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM on ``device`` and its tokenizer, from a hub id or a local directory."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = resolve_dtype(dtype, device)
    common: dict[str, object] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if gguf_file:
        common["gguf_file"] = gguf_file
    if fast_tokenizer and not gguf_file:
        tokenizer = load_tokenizer_json(name_or_path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **common)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **common)
    model.to(device)
    return model, tokenizer


def use_chat_template(
    requested: bool | None, name: str, tokenizer: PreTrainedTokenizerBase
) -> bool:
    """Whether prompts are wrapped as a user turn of the tokenizer's chat template.

    ``requested=None`` decides from the name (instruction-tuned checkpoints) and whether the
    tokenizer has a template; ``True`` without a template is an error.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested is None:
        return has_template and any(m in name.lower() for m in INSTRUCT_MARKERS)
    if requested and not has_template:
        raise ValueError(f"chat_template=True but the tokenizer of {name!r} has no chat template")
    return bool(requested)
