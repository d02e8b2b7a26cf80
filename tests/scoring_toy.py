"""A tiny deterministic stand-in model for the `gnll score` IO tests (no weights, microseconds a row).

Tokens are the answer's characters; log p(c) = -0.1 * (1 + ord(c) % 7); the "greedy" answer is
lower-case letters only; a prompt + answer over 400 characters is "over the context".
"""

from __future__ import annotations

import time

from gnll.backends.base import Capabilities, Generation, Model, ScoredAnswer

CONTEXT = 400


class ToyModel(Model):
    name = "toy"
    capabilities = Capabilities(beams=False, scoring=True)

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    def render_prompt(self, prompt: str) -> str:
        return f"<user>{prompt}</user>\n"

    def score(self, prompts, answers, *, raw_prompt=False, batch_size=None, progress=False):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        out = []
        for p, a in zip(prompts, answers, strict=True):
            text = p if raw_prompt else self.render_prompt(p)
            if len(text) + len(a) > CONTEXT:
                raise ValueError(
                    f"prompt + answer is {len(text) + len(a)} characters, over the context of {CONTEXT}"
                )
            out.append(
                ScoredAnswer(
                    text=a,
                    token_ids=[ord(c) for c in a],
                    tokens=list(a),
                    token_logprobs=[-0.1 * (1 + ord(c) % 7) for c in a],
                    is_greedy=a.isalpha() and a.islower(),
                    greedy_stops=True,
                )
            )
        return out

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        return [
            [
                Generation(
                    text="toy",
                    token_ids=[1, 2],
                    tokens=["to", "y"],
                    token_logprobs=[-0.5, -0.25],
                    finish_reason="stop",
                )
            ]
            for _ in prompts
        ]

    def score_tokens(self, prompts, continuations):  # the old token-id interface, unused here
        raise NotImplementedError
