"""A scripted stand-in model for the server tests that check plumbing, not a language model."""

from __future__ import annotations

import threading
import time

from gnll.backends.base import Generation, Model

#: prompt -> (answer tokens, their log-probs); other prompts get SURE.
SURE = (["Paris", "."], [-0.01, -0.02])
UNSURE = (["Maybe", " Lyon"], [-2.0, -3.0])
SCRIPT = {"unsure": UNSURE}


class ScriptedModel(Model):
    """Answers from :data:`SCRIPT`; records every ``generate`` call's batch size."""

    name = "scripted"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[int] = []
        self.configs: list = []
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def render_prompt(self, prompt: str) -> str:
        return prompt

    def generate(self, prompts, config=None, **kwargs):
        with self.lock:
            self.calls.append(len(prompts))
            self.prompts.extend(prompts)
            self.configs.append(config)
        if self.delay:
            time.sleep(self.delay)
        out = []
        for p in prompts:
            tokens, lps = SCRIPT.get(p.strip(), SURE)
            n = config.num_sequences if config is not None else 1
            out.append(
                [
                    Generation(
                        "".join(tokens).strip(),
                        list(range(len(tokens))),
                        list(tokens),
                        list(lps),
                        "eos",
                    )
                    for _ in range(n)
                ]
            )
        return out

    def score(self, prompts, answers, **kwargs):
        raise NotImplementedError("the scripted model only generates")
