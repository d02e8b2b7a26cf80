"""One line of ``samples.jsonl``: a question's generations, correctness, measures and token cost.

Assembled from the stage caches (:mod:`gnll.evaluation.stages`) once every stage has run; the
measures come from :func:`gnll.measures.compute`, restricted to those the question's evidence allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gnll import measures as M
from gnll.backends.base import Generation
from gnll.evaluation.correctness import contains_match, f1_verdict, judge_verdict
from gnll.evaluation.datasets import Example
from gnll.evaluation.stages import TaskStages

__all__ = ["assemble_record", "correctness_of", "token_cost"]


def token_cost(gens: Sequence[Generation]) -> int:
    """Tokens generated for ``gens``, terminators included (what a measure costs)."""
    return sum(len(g.token_ids) + len(g.terminator_token_ids or []) for g in gens)


def correctness_of(
    stages: TaskStages, key: tuple[str, int], example: Example, answer: str, metrics: Sequence[str]
) -> dict[str, Any]:
    """The verdict of each correctness metric on ``answer`` (the judge's from its cache)."""
    cfg = stages.cfg
    out: dict[str, Any] = {}
    for metric in metrics:
        if metric == "f1":
            verdict = f1_verdict(answer, example.answers, example.numeric_answer, cfg.f1_rule)
            out["f1"] = verdict.to_dict()
        elif metric == "contains":
            out["contains"] = contains_match(
                answer, example.answers, example.numeric_answer
            ).to_dict()
        elif metric == "judge":
            if stages.judge is None:
                raise ValueError("correctness 'judge' needs a judge model: give --judge MODEL")
            reply = stages.judge.reply(key)
            out["judge"] = {**judge_verdict(reply).to_dict(), "reply": reply, "judge": cfg.judge}
    return out


def assemble_record(
    stages: TaskStages,
    key: tuple[str, int],
    example: Example,
    metrics: Sequence[str],
    temperature: float | None,
    *,
    beams: bool,
) -> dict[str, Any]:
    """The ``samples.jsonl`` record of question ``key`` (its stages must have run)."""
    cfg = stages.cfg
    greedy = stages.greedy.answer(key)
    record: dict[str, Any] = {
        "task": stages.run.name,
        "split": key[0],
        "pos": key[1],
        "id": example.id,
        "question": example.question,
    }
    if example.context:
        record["context"] = example.context
    record["answers"] = list(example.answers)
    record["prompt"] = stages.greedy.rendered_prompt(key)
    record["greedy"] = greedy.to_dict()
    record["correctness"] = correctness_of(stages, key, example, greedy.text, metrics)
    cost = {"greedy": token_cost([greedy])}
    beam_gens = samples = cluster_ids = None
    if beams and stages.beams is not None:
        beam_gens = stages.beams.generations(key)
        record["beams"] = [b.to_dict() for b in beam_gens]
        cost["beams"] = token_cost(beam_gens)
    if temperature is not None and cfg.needs_samples:
        samples = stages.samples(temperature).generations(key)
        rows = [s.to_dict() for s in samples]
        clusters = stages.clusters(temperature)
        if clusters is not None:
            cluster_ids = clusters.cluster_ids(key)
            for row, c in zip(rows, cluster_ids, strict=True):
                row["cluster_id"] = c
        record["temperature"] = temperature
        record["samples"] = rows
        cost["samples"] = token_cost(samples)
    evidence = M.Evidence.of(greedy, beam_gens, samples, cluster_ids)
    names = M.computable(cfg.active_measures, evidence.available)
    record["measures"] = M.compute(names, greedy, beam_gens, samples, cluster_ids)
    record["cost_tokens"] = cost
    return record
