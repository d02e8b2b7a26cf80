"""One line of ``samples.jsonl``: a question's generations, correctness, measures and token cost.

Assembled from the stage caches (:mod:`gnll.evaluation.run.stages`) once every stage has run; the
measures come from :func:`gnll.measures.compute`, restricted to those the question's evidence allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gnll import measures as M
from gnll.backends.base import EmptyAnswerError, Generation
from gnll.evaluation.data.datasets import Example
from gnll.evaluation.results.correctness import (
    contains_match,
    f1_verdict,
    judge_index,
    judge_verdict,
)
from gnll.evaluation.run.stages import TaskStages

__all__ = ["assemble_record", "correctness_of", "measure_logprobs", "token_cost"]


def token_cost(gens: Sequence[Generation]) -> int:
    """Tokens generated for ``gens``, terminators included (what a measure costs)."""
    return sum(len(g.token_ids) + len(g.terminator_token_ids or []) for g in gens)


def measure_logprobs(
    gen: Generation, *, sampling: bool = False, empty: str = "terminator"
) -> list[float]:
    """The token log-probs a measure sees for ``gen``.

    ``sampling``: a sampled answer's log-probs under the distribution it was drawn from
    (``Generation.sampling_logprobs``, e.g. tempered) instead of the temperature-1 model's.
    ``empty="terminator"``: gnll's one empty-answer rule (:attr:`Generation.measured_logprobs`):
    an answer without tokens gets the log-prob of its stop token, instead of log-likelihood 0
    (maximal certainty). ``empty="zero"`` (``--empty_answer zero``) only reassembles old runs.

    >>> g = Generation("", [], [], [], "stop", terminator_token_ids=[198], terminator_logprobs=[-2.5])
    >>> measure_logprobs(g), measure_logprobs(g, empty="zero")
    ([-2.5], [])
    >>> s = Generation("a", [1], ["a"], [-1.0], "stop", sampling_logprobs=[-0.4])
    >>> measure_logprobs(s), measure_logprobs(s, sampling=True)
    ([-1.0], [-0.4])
    >>> e = Generation("", [], [], [], "stop", terminator_token_ids=[198], terminator_logprobs=[-2.5],
    ...                sampling_logprobs=[-0.9])
    >>> measure_logprobs(e, sampling=True)
    [-0.9]
    """
    if not gen.token_ids and not gen.tokens:
        if empty != "terminator":
            return []
        if sampling and gen.sampling_logprobs is not None:
            # The stop token's log-prob under the tempered distribution, like every other sample's
            # tokens (never the temperature-1 one mixed in).
            if not gen.sampling_logprobs:
                raise EmptyAnswerError(
                    "a sampled answer is empty and its stop token's log-prob under the sampling "
                    "distribution is unknown, so --sample_logprobs sampling cannot score it"
                )
            return [float(gen.sampling_logprobs[0])]
        return gen.measured_logprobs
    if sampling and gen.sampling_logprobs is not None:
        return list(gen.sampling_logprobs)
    return gen.measured_logprobs


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
        elif judge_index(metric) is not None:
            judge = stages.judges.get(metric)
            if judge is None:
                raise ValueError(f"correctness {metric!r} needs a judge model: give --judge MODEL")
            reply = judge.reply(key)
            out[metric] = {**judge_verdict(reply).to_dict(), "reply": reply, "judge": judge.name}
    return out


def assemble_record(
    stages: TaskStages,
    key: tuple[str, int],
    example: Example,
    metrics: Sequence[str],
    temperature: float | Mapping[str, float] | None,
    *,
    beams: bool,
) -> dict[str, Any]:
    """The ``samples.jsonl`` record of question ``key`` (its stages must have run).

    ``temperature`` is one temperature for every sampling-based measure, or one per measure
    (``{"pe": 0.5, "se": 1.0, ...}``): each measure is then computed from the samples drawn at its
    own temperature. The record keeps the samples of the temperature most measures use (``samples``,
    ``temperature``) and the others under ``samples_at``; ``measure_temperatures`` says which is
    whose.
    """
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
    # --reference beam (the paper's Table 5): the top beam is judged and is G-NLL's sequence
    reference = greedy if cfg.reference == "greedy" else stages.reference.answer(key)
    if cfg.reference == "beam":
        record["reference"] = {"kind": "top beam", **reference.to_dict()}
    record["correctness"] = correctness_of(stages, key, example, reference.text, metrics)
    cost = {"greedy": token_cost([greedy])}
    beam_gens = None
    if beams and stages.beams is not None:
        beam_gens = stages.beams.generations(key)
        record["beams"] = [b.to_dict() for b in beam_gens]
        cost["beams"] = token_cost(beam_gens)

    def lps(gens: Sequence[Generation] | None, sampling: bool = False) -> list | None:
        if gens is None:
            return None
        return [measure_logprobs(g, sampling=sampling, empty=cfg.empty_answer) for g in gens]

    active = list(cfg.active_measures)
    measured = measure_logprobs(reference, empty=cfg.empty_answer)
    # g-nll+eos adds the terminator's log-probs that `measured` does not already count
    base = M.Evidence.of(
        measured, lps(beam_gens), terminator=M.terminator_logprobs(reference, measured)
    )
    values = M.compute(
        M.computable(active, base.available), base.greedy, base.beams, terminator=base.terminator
    )
    sampled = [m for m in active if M.get(m).uses_samples]
    if temperature is not None and cfg.needs_samples and sampled:
        per = (
            {m: temperature[m] for m in sampled}
            if isinstance(temperature, Mapping)
            else dict.fromkeys(sampled, temperature)
        )
        # the temperature most measures use comes first (ties: the lower temperature)
        order = sorted(set(per.values()), key=lambda t: (-list(per.values()).count(t), t))
        for i, temp in enumerate(order):
            samples = stages.samples(temp).generations(key)
            rows = [s.to_dict() for s in samples]
            cluster_ids = None
            clusters = stages.clusters(temp)
            if clusters is not None:
                cluster_ids = clusters.cluster_ids(key)
                for row, c in zip(rows, cluster_ids, strict=True):
                    row["cluster_id"] = c
            if i == 0:
                record["temperature"] = temp
                record["samples"] = rows
                cost["samples"] = token_cost(samples)
            else:
                record.setdefault("samples_at", {})[f"{temp:g}"] = rows
            ev = M.Evidence.of(
                samples=lps(samples, cfg.sample_logprobs == "sampling"), cluster_ids=cluster_ids
            )
            mine = [m for m in sampled if per[m] == temp]
            values.update(
                M.compute(
                    M.computable(mine, ev.available), samples=ev.samples, cluster_ids=ev.cluster_ids
                )
            )
        if isinstance(temperature, Mapping):
            record["measure_temperatures"] = per
    record["measures"] = {m: values[m] for m in active if m in values}
    record["cost_tokens"] = cost
    return record
