"""Next-token distributions of a real model along a greedy answer (the counterpart of the paper's
Fig. 3, which shows simulated Dirichlet distributions: ``gnll simulate``).

For each prompt, the greedy answer is generated, then one teacher-forced forward pass over prompt and
answer gives ``p(y_t | x, y_<t)`` at every answer step; the ``k`` most likely tokens of each step are
kept. The greedy token is the most likely one at every step (that is what greedy decoding is), so
G-NLL is the sum of ``-log max_v p(v | ...)`` over the bars marked in the figure.

Example
-------
>>> from gnll import load_model
>>> model = load_model("smollm2-135m-instruct", progress=False)
>>> [d] = next_token_distributions(model, ["Question: What is the capital of France?\\nAnswer:"])
>>> d["steps"][0]["greedy"] == d["steps"][0]["top"][0][0]
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnll import measures as M

__all__ = ["next_token_distributions", "plot_next_tokens"]


def next_token_distributions(
    model: Any, prompts: Sequence[str], *, k: int = 8, max_new_tokens: int = 12
) -> list[dict[str, Any]]:
    """Per prompt: the greedy answer and, per answer step, the top ``k`` tokens with probabilities.

    ``model`` is an hf-backend model (it needs the transformers module for the forward pass).
    Returns ``[{"prompt", "answer", "g_nll", "steps": [{"greedy", "greedy_prob", "top":
    [(token, prob), ...]}]}]``.
    """
    import torch

    from gnll.backends.base import GenerationConfig
    from gnll.backends.hf import HFModel

    # The figure needs the whole next-token distribution, which only the hf backend's forward
    # pass gives: it takes an HFModel (and uses its declared attributes), not any Model.
    if not isinstance(model, HFModel):
        raise TypeError("next-token distributions need an hf-backend model (transformers weights)")
    gens = model.generate(list(prompts), GenerationConfig.greedy(max_new_tokens=max_new_tokens))
    out = []
    for prompt, (gen,), ids in zip(prompts, gens, model.encode(list(prompts)), strict=True):
        full = torch.tensor([ids + list(gen.token_ids)], device=model.device)
        with torch.inference_mode():
            logits = model.model(full).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        steps = []
        for t, tok in enumerate(gen.token_ids):
            row = logp[len(ids) - 1 + t]
            top = torch.topk(row, k)
            steps.append(
                {
                    "greedy": model.tokenizer.decode([tok]),
                    "greedy_prob": math.exp(float(row[tok])),
                    "top": [
                        (model.tokenizer.decode([int(i)]), math.exp(float(v)))
                        for v, i in zip(top.values, top.indices, strict=True)
                    ],
                }
            )
        out.append(
            {
                "prompt": prompt,
                "answer": gen.text,
                "g_nll": M.g_nll(gen),
                "steps": steps,
            }
        )
    return out


def plot_next_tokens(data: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """One row of panels per answer, one panel per step: top-k bars, the greedy token in colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(data)
    cols = max((len(d["steps"]) for d in data), default=1) or 1
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.1 * cols, 2.3 * rows), squeeze=False, sharey=True
    )
    for r, d in enumerate(data):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(d["steps"]):
                ax.axis("off")
                continue
            step = d["steps"][c]
            labels = [repr(tok)[1:-1] or "∅" for tok, _ in step["top"]]
            probs = [p for _, p in step["top"]]
            colours = [
                "tab:orange" if tok == step["greedy"] else "tab:grey" for tok, _ in step["top"]
            ]
            ax.bar(range(len(probs)), probs, color=colours)
            ax.set_xticks(range(len(probs)), labels, rotation=70, fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(f"t={c + 1}: {labels[0]!s}", fontsize=8)
            if c == 0:
                # the G-NLL of the tokens drawn: of the whole answer only if it ended within them
                n = len(d["steps"])
                ax.set_ylabel(
                    f"{d['answer'][:18]!r}\nG-NLL of {n} tokens {d['g_nll']:.2f}", fontsize=8
                )
    fig.suptitle(title or "p(y_t | x, y_<t) along the greedy answer (orange: greedy token)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
