"""Progress of a split in questions, moving as the backend finishes prompts, not once per chunk.

A chunk of questions goes through several stages (greedy answer, judge, beams, samples, clusters),
each one generate call over the whole chunk. The bar counts questions; a chunk's questions are
shared out among its stages by a rough cost weight (generated sequences per question), and within
a stage the backend's ``progress`` callback reports finished prompts as they finish. So the bar
moves within the first seconds and its rate (and ETA) is meaningful long before a chunk ends.
Whatever a backend does not report (a cached stage, a backend without the callback) is caught up
when the stage ends; a chunk always ends exactly at its last question.

Examples
--------
>>> from tqdm import tqdm
>>> p = SplitProgress(tqdm(total=10, disable=True), {"greedy": 1.0, "samples": 3.0})
>>> p.start_chunk(10, ["greedy", "samples T=1"])
>>> p.stage("greedy"); p.prompts_done(5, of=10); p.n
1.25
>>> p.stage("samples T=1"); p.n
2.5
>>> p.end_chunk(); p.n
10.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SplitProgress", "stage_weights"]


def stage_weights(beams: int, samples: int) -> dict[str, float]:
    """Rough relative cost per question of each stage label's prefix (sequences generated, with
    beams and samples at about half a greedy answer each: one prefill, wide batches)."""
    return {
        "greedy": 1.0,
        "judge": 0.5,
        "beams": max(1.0, 0.5 * beams),
        "samples": max(1.0, 0.5 * samples),
        "clusters": max(0.2, 0.05 * samples),
    }


class SplitProgress:
    """Moves a tqdm ``bar`` (total = questions of the split) stage by stage within chunks."""

    #: A tqdm format that shows the fractional question count as a whole number.
    BAR_FORMAT = "{l_bar}{bar}| {n:.0f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"

    def __init__(self, bar: Any, weights: Mapping[str, float]) -> None:
        self.bar = bar
        self.weights = dict(weights)
        #: Questions done so far (fractional within a chunk).
        self.n = 0.0
        self._chunk_end = 0.0
        self._share: dict[str, float] = {}
        self._stage: str | None = None
        self._stage_end = 0.0

    def _advance(self, step: float) -> None:
        if step > 0:
            self.n += step
            self.bar.update(step)

    def _weight(self, label: str) -> float:
        return self.weights.get(label.split(" ")[0], 1.0)

    def start_chunk(self, n_questions: int, labels: Sequence[str]) -> None:
        """A chunk of ``n_questions`` whose stages will be ``labels`` (in order)."""
        total = sum(self._weight(lb) for lb in labels) or 1.0
        self._share = {lb: n_questions * self._weight(lb) / total for lb in labels}
        self._chunk_end = self.n + n_questions
        self._stage, self._stage_end = None, self.n

    def stage(self, label: str) -> None:
        """The next stage starts (the previous one is complete)."""
        self._finish_stage()
        self._stage = label
        self._stage_end = min(self._chunk_end, self.n + self._share.get(label, 0.0))
        self.bar.set_postfix_str(label, refresh=False)

    def prompts_done(self, done: float, *, of: int) -> None:
        """``done`` more of the ``of`` prompts of the current stage's generate call finished."""
        if self._stage is None or of <= 0:
            return
        step = self._share.get(self._stage, 0.0) * done / of
        self._advance(min(step, self._stage_end - self.n))

    def _finish_stage(self) -> None:
        if self._stage is not None:
            self._advance(self._stage_end - self.n)

    def end_chunk(self) -> None:
        """The chunk is done: the bar stands exactly at its end."""
        self._finish_stage()
        self._stage = None
        self._advance(self._chunk_end - self.n)
        # Float shares must not leave 9.999999 behind: snap to the whole number of questions.
        self.n = self._chunk_end = float(round(self._chunk_end))
        if not getattr(self.bar, "disable", False):
            self.bar.n = round(self._chunk_end)
            self.bar.refresh()
