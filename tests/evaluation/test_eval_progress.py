"""The evaluation's progress bar moves as the backend finishes prompts, not once per chunk."""

from __future__ import annotations

from fakes import FakeModel, cfg, make_data_dir

from gnll.evaluation.run.progress import SplitProgress
from gnll.evaluation.run.runner import Evaluator


class ReportingModel(FakeModel):
    """A fake that tells the caller about each finished prompt, as the hf backend does."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluator: Evaluator | None = None
        self.positions: list[tuple[str, float]] = []

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        out = super().generate(prompts, config, batch_size=batch_size)
        assert callable(progress)
        for _ in prompts:
            progress(1)
            self.positions.append((config.strategy, self.evaluator._progress.n))
        return out


def test_bar_moves_within_chunks_and_ends_on_every_question(tmp_path, monkeypatch):
    data = make_data_dir(tmp_path / "data")
    model = ReportingModel()
    config = cfg(data, tmp_path / "run", tasks=["triviaqa_short"], limit=16, chunk_size=8)
    model.evaluator = Evaluator(config, model=model)
    ends: list[float] = []
    real_end_chunk = SplitProgress.end_chunk

    def end_chunk(self):
        real_end_chunk(self)
        ends.append(self.n)

    monkeypatch.setattr(SplitProgress, "end_chunk", end_chunk)
    model.evaluator.run()
    greedy = [n for s, n in model.positions if s == "greedy"][-16:]  # the evaluation split
    # The greedy stage's share of each chunk moves the bar prompt by prompt.
    for chunk, start in ((greedy[:8], 0), (greedy[8:], 8)):
        assert all(start < a < b < start + 8 for a, b in zip(chunk, chunk[1:], strict=False))
    # Every chunk ends exactly on its last question: held-out answers judged first (16 in 2
    # chunks; sampling waits until they are not all one class), then sampled, then evaluation.
    assert ends == [8.0, 16.0, 8.0, 16.0, 8.0, 16.0]
