"""The stand-in models the tests share (no weights: microseconds a call), one home for each.

- :class:`FakeModel` (:class:`GreedyEdited`: one whose greedy answers a test changes), :class:`FakeJudge`, :func:`make_data_dir`, :func:`cfg`: the evaluation runner's
  model, judge and data. The model answers "What is k plus one?" deterministically given (prompt,
  strategy, seed, temperature, sequence index), so an interrupted-then-resumed run must reproduce an
  uninterrupted one exactly.
- :class:`ToyModel`: `gnll score`'s scorer. Tokens are the answer's characters;
  log p(c) = -0.1 * (1 + ord(c) % 7); the "greedy" answer is lower-case letters only; a prompt +
  answer over :data:`CONTEXT` characters is "over the context".

Subprocess tests import this module by path (``sys.path.insert(0, <tests>)``), so it imports nothing
heavy at the top.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gnll.backends.base import Capabilities, Generation, GenerationConfig, Model, ScoredAnswer

if TYPE_CHECKING:
    from gnll.evaluation.run.runner import EvalConfig

N_QUESTIONS = 160


def make_data_dir(root: Path) -> Path:
    """Synthetic files in the three original formats: question k asks for k + 1."""
    (root / "triviaqa").mkdir(parents=True)
    (root / "svamp").mkdir()
    (root / "nq_open").mkdir()
    with (root / "triviaqa" / "triviaqa_unfiltered_validation.jsonl").open("w") as fh:
        for k in range(N_QUESTIONS):
            rec = {
                "index": k,
                "question": f"What is {k} plus one?",
                "aliases": [f"n{k + 1}", f"num {k + 1}"],
            }
            fh.write(json.dumps(rec) + "\n")
    svamp = [
        {
            "ID": f"chal-{k}",
            "Body": f"Tom has {k} apples. He gets one more.",
            "Question": "How many now?",
            "Equation": f"( {k}.0 + 1.0 )",
            "Answer": float(k + 1),
            "Type": "Addition",
        }
        for k in range(N_QUESTIONS)
    ]
    (root / "svamp" / "SVAMP.json").write_text(json.dumps(svamp))
    with (root / "nq_open" / "NQ-open.dev.jsonl").open("w") as fh:
        for k in range(N_QUESTIONS):
            fh.write(
                json.dumps({"question": f"what is {k} plus one", "answer": [f"n{k + 1}"]}) + "\n"
            )
    return root


def _u(*parts) -> float:
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64


class FakeModel(Model):
    """Answers 'What is k plus one?' with n{k+1} (or a wrong number); confident when right."""

    capabilities = Capabilities()  # beams, scoring, terminator, tempered log-probs

    def __init__(self, name="fake-lm", fail_after: int | None = None, delay: float = 0.0):
        self.name = name
        self.calls: Counter = Counter()
        self.fail_after = fail_after
        self.delay = delay
        self.n_calls = 0

    def _answer(self, prompt: str, key: tuple) -> tuple[str, list[float]]:
        qs = re.findall(r"(?:What is|what is|Tom has) (\d+)", prompt)
        k = int(qs[-1])
        difficulty = _u("difficulty", k)
        right = f"{k + 1}" if "apples" in prompt.rsplit("Context:", 1)[-1] else f"n{k + 1}"
        if _u("correct", key) > difficulty:
            text = right
            lps = [-0.05 - 0.5 * difficulty * _u("lp", key, 0), -0.1 * _u("lp", key, 1)]
        else:
            text = right[:-1] + str((k + 7) % 10) if right[-1] != str((k + 7) % 10) else right + "0"
            lps = [-0.5 - 2 * difficulty * _u("lp", key, 0), -1.0 * _u("lp", key, 1), -0.3]
        return text, lps

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        config = config or GenerationConfig()
        self.n_calls += 1
        if self.fail_after is not None and self.n_calls > self.fail_after:
            raise RuntimeError("injected failure")
        if self.delay:
            time.sleep(self.delay)
        self.calls[config.strategy] += len(prompts)
        out = []
        for p in prompts:
            gens = []
            for j in range(config.num_sequences):
                if config.strategy == "greedy":
                    key = (p, "greedy")
                elif config.strategy == "beam":
                    key = (p, "beam", j) if j else (p, "greedy")
                else:
                    key = (p, "sample", config.seed, config.temperature, j)
                text, lps = self._answer(p, key)
                ids = [int(_u("id", text, i) * 1000) for i in range(len(lps))]
                gens.append(
                    Generation(
                        text=text,
                        token_ids=ids,
                        tokens=[text] * len(lps),
                        token_logprobs=lps,
                        finish_reason="stop",
                        stop_sequence="\n",
                        terminator_token_ids=[198],
                        terminator_logprobs=[-0.01],
                    )
                )
            out.append(gens)
        return out

    def score(self, prompts, continuations):  # pragma: no cover - not used by the runner
        return [np.zeros(len(c)) for c in continuations]

    def render_prompt(self, prompt: str) -> str:
        return f"<user>{prompt}</user>"

    def info(self):
        return {"name": self.name, "kind": "fake"}


class GreedyEdited(FakeModel):
    """:class:`FakeModel` whose greedy answers :meth:`edit` changes (how each ends, its length),
    each by a number its prompt gives (the sum of the prompt's code points)."""

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        out = super().generate(prompts, config, batch_size=batch_size, progress=progress)
        if config is None or config.strategy != "greedy":
            return out
        for p, gens in zip(prompts, out, strict=True):
            self.edit(gens[0], sum(map(ord, p)))
        return out

    def edit(self, g: Generation, k: int) -> None:
        raise NotImplementedError


class FakeJudge(FakeModel):
    """Says yes iff the proposed answer appears among the expected ones; sometimes rambles."""

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        self.calls["judge"] += len(prompts)
        out = []
        for p in prompts:
            proposed = re.search(r"The proposed answer is: (.*)\n", p).group(1)
            expected = p.split("expected answer")[1].split("\n")[0]
            if _u("ramble", p) < 0.1:
                reply = "I am not sure."
            else:
                reply = "Yes" if proposed in expected else "No"
            out.append([Generation(reply, [1], [reply], [-0.1], "stop")])
        return out


def cfg(data_dir: Path, out: Path, **kw) -> EvalConfig:
    """The runner tests' small run of the fake model: two tasks, 24 questions, every stage."""
    from gnll.evaluation.run.runner import EvalConfig

    base = dict(
        model="fake-lm",
        tasks=["triviaqa_short", "svamp_short"],
        output_path=out,
        data_dir=str(data_dir),
        limit=24,
        beams=3,
        samples=4,
        chunk_size=8,
        heldout_size=16,
        clusterer="exact",
        n_boot=50,
        plots=False,
        progress=False,
    )
    base.update(kw)
    return EvalConfig(**base)


CONTEXT = 400


class ToyModel(Model):
    """`gnll score`'s stand-in scorer (see the module docstring)."""

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


def kill_when_eval_starts(
    proc: subprocess.Popen, out: Path, task: str = "triviaqa_short", wait: float = 240
) -> None:
    """SIGKILL ``proc`` (a ``gnll eval`` driver writing to ``out``) once ``task``'s eval split has
    records in its greedy cache, i.e. mid-run; fail if it finished first."""
    import signal
    import time

    cache = out / "tasks" / task / "cache"
    deadline = time.time() + wait
    while time.time() < deadline and proc.poll() is None:
        files = list(cache.glob("greedy-*.jsonl")) if cache.exists() else []
        if files and '"eval"' in files[0].read_text():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "results.json").exists()
