"""Token selection and the chosen token's log-probs: the parts of a decoding step besides the model.

Both decoding paths use them: gnll's loop (:mod:`.decode`) calls them on each step's logits, and
transformers' ``generate`` path (:mod:`.hf_generate`) calls them from a logits processor. So greedy
choice, seeded inverse-CDF sampling and the reported log-probs are the same code on both paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import torch

from gnll._util.seeds import sample_seed

#: Uniforms are capped below 1 so that ``u * total`` stays strictly below the CDF's last entry in
#: float32, and a zero-probability token can never be picked.
_U_MAX = 1 - 2**-22


def sample_uniforms(
    seed: int | None, prompts: Sequence[Sequence[int]], num_samples: int, steps: int
) -> torch.Tensor:
    """One uniform per (row, step); row ``i * num_samples + j`` is sample j of ``prompts[i]``.

    Each row's stream is seeded by :func:`~gnll._util.seeds.sample_seed` from the seed, the
    prompt's token ids and j: it does not depend on which other prompts share the call or the batch.

    >>> u = sample_uniforms(0, [[5, 6], [7]], 2, 3)
    >>> tuple(u.shape), bool(torch.equal(u[2:], sample_uniforms(0, [[7]], 2, 3)))
    ((4, 3), True)
    """
    streams = [
        np.random.default_rng(sample_seed(seed, ids, j)).random(steps)
        for ids in prompts
        for j in range(num_samples)
    ]
    return torch.from_numpy(np.minimum(np.stack(streams), _U_MAX)).float()


class StepScores:
    """One decoding step's float32 logits (rows x vocab) and what is derived from them, each once.

    Parameters
    ----------
    logits:
        The model's raw logits (temperature 1, no processing).
    temperature:
        The sampling temperature tau; log-probs are reported under both ``softmax(logits)`` and
        ``softmax(logits / tau)``.

    Examples
    --------
    >>> s = StepScores(torch.tensor([[0.0, 2.0, 1.0]]), temperature=0.5)
    >>> s.greedy().tolist(), s.sample(torch.tensor([0.5])).tolist(), s.sample(torch.tensor([0.0])).tolist()
    ([1], [1], [0])
    >>> raw, tempered = s.logprobs(torch.tensor([1]))
    >>> round(raw.item(), 4), round(tempered.item(), 4)
    (-0.4076, -0.1429)
    """

    def __init__(self, logits: torch.Tensor, temperature: float = 1.0) -> None:
        self.logits = logits
        self.temperature = float(temperature)

    @cached_property
    def lse(self) -> torch.Tensor:
        """``logsumexp`` of the raw logits per row: ``log_softmax`` at one token is one subtraction."""
        return torch.logsumexp(self.logits, dim=-1)

    @cached_property
    def scaled(self) -> torch.Tensor:
        return self.logits / self.temperature if self.temperature != 1.0 else self.logits

    @cached_property
    def lse_scaled(self) -> torch.Tensor:
        return torch.logsumexp(self.scaled, dim=-1) if self.temperature != 1.0 else self.lse

    def greedy(self) -> torch.Tensor:
        """The argmax token of every row."""
        return self.logits.argmax(dim=-1)

    def sample(self, u: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF sampling from ``softmax(logits / tau)``: row r takes the first token whose
        cumulative mass exceeds ``u[r]`` times the total."""
        cdf = torch.exp(self.scaled - self.lse_scaled[:, None]).cumsum_(dim=-1)
        target = (u.to(cdf.device) * cdf[:, -1])[:, None]
        chosen = torch.searchsorted(cdf, target, right=True)[:, 0]
        return chosen.clamp_(max=cdf.shape[1] - 1)

    def logprobs(self, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log p(chosen)`` per row under the raw logits, and under the tempered ones if tau != 1."""
        chosen_logit = self.logits.gather(1, chosen[:, None])[:, 0]
        raw = chosen_logit - self.lse
        if self.temperature == 1.0:
            return raw, None
        return raw, chosen_logit / self.temperature - self.lse_scaled
