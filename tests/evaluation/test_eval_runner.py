"""The evaluation runner with a scripted fake model (tests/fakes.py): stages, caching, resume,
fingerprints, outputs.

The fake model is deterministic given (prompt, strategy, seed, temperature, sequence index), so an
interrupted-then-resumed run must reproduce an uninterrupted one exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakes import FakeJudge, FakeModel, cfg, kill_when_eval_starts

from gnll.evaluation.run.runner import EvalConfig, Evaluator, FingerprintMismatchError


def test_full_run_outputs(data_dir, tmp_path):
    model = FakeModel()
    res = Evaluator(cfg(data_dir, tmp_path / "run", plots=True), model=model).run()
    out = tmp_path / "run"
    for name in ("samples.jsonl", "results.json", "table.md", "timings.json", "run.json"):
        assert (out / name).exists(), name
    assert sorted(p.name for p in (out / "plots").glob("*.png"))
    recs = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(recs) == 48
    r = recs[0]
    assert r["prompt"].startswith("<user>Answer the following question as briefly as possible.\n")
    assert len(r["beams"]) == 3 and len(r["samples"]) == 4
    assert all("cluster_id" in s for s in r["samples"])
    assert set(r["measures"]) == {
        "pe",
        "ln-pe",
        "se",
        "ln-se",
        "d-se",
        "se-rb",
        "ln-se-rb",
        "mcp",
        "g-nll",
        "ln-g-nll",
        "bs-msp",
    }
    assert r["measures"]["g-nll"] == pytest.approx(-sum(r["greedy"]["token_logprobs"]))
    assert "f1" in r["correctness"]
    t = res["tasks"]["triviaqa_short"]
    assert t["temperature"]["selected_by"] == "heldout"
    assert t["temperature"]["value"] in (0.5, 1.0, 1.5)
    assert set(t["temperature"]["candidates"]) == {"0.5", "1", "1.5"}
    m = t["metrics"]["f1"]
    assert m["n"] == 24
    assert m["measures"]["g-nll"]["auroc"] > 0.5  # the fake model is confident when right
    assert "p_value" in m["significance"]
    table = (out / "table.md").read_text()
    assert "| fake-lm | triviaqa_short | F1 | 24 |" in table
    assert "G-NLL" in table and "BS-MSP" in table
    # stages: heldout greedy 16 + eval 24 per task; samples at 3 temperatures on held-out, 1 on eval
    assert model.calls["greedy"] == 2 * (16 + 24)
    assert model.calls["beam"] == 2 * 24
    # eval samples at every temperature some measure chose (per-measure selection)
    n_temps = [len(set(t["temperature"]["per_measure"].values())) for t in res["tasks"].values()]
    assert model.calls["sample"] == 2 * 3 * 16 + 24 * sum(n_temps)


def test_gnll_only_skips_beams_samples_and_clustering(data_dir, tmp_path):
    model = FakeModel()
    res = Evaluator(cfg(data_dir, tmp_path / "g", measures=["g-nll"]), model=model).run()
    assert set(model.calls) == {"greedy"}
    assert model.calls["greedy"] == 48  # no held-out pass either
    rec = json.loads((tmp_path / "g" / "samples.jsonl").open().readline())
    assert set(rec["measures"]) == {"g-nll"} and "samples" not in rec and "beams" not in rec
    assert res["tasks"]["svamp_short"]["temperature"]["selected_by"] == "not needed"
    assert not list((tmp_path / "g" / "tasks" / "svamp_short" / "cache").glob("clusters*"))


class AlwaysWrong(FakeModel):
    def _answer(self, prompt, key):
        text, lps = super()._answer(prompt, key)
        return "nobody", lps


def test_single_class_heldout_is_not_sampled(data_dir, tmp_path):
    # Every held-out answer wrong: no candidate temperature has a defined AUROC, so the default is
    # taken without sampling the held-out questions (the choice sampling would have led to).
    model = AlwaysWrong()
    out = tmp_path / "w"
    res = Evaluator(cfg(data_dir, out, beams=0), model=model).run()
    assert model.calls["greedy"] == 2 * (16 + 24)
    assert model.calls["sample"] == 2 * 24  # the evaluation questions only, at one temperature
    sel = res["tasks"]["triviaqa_short"]["temperature"]
    assert sel["single_class"] and sel["value"] == 1.0 and sel["candidates"] == {}
    assert set(sel["per_measure"].values()) == {1.0}
    assert "all 16 judged held-out answers are wrong" in sel["notes"]["pe"]
    assert "default (held-out AUROC undefined)" in (out / "table.md").read_text()


def test_fixed_temperature_skips_heldout(data_dir, tmp_path):
    model = FakeModel()
    res = Evaluator(cfg(data_dir, tmp_path / "t", temperature=0.7, beams=0), model=model).run()
    assert model.calls["greedy"] == 48 and model.calls["sample"] == 48 and "beam" not in model.calls
    sel = res["tasks"]["triviaqa_short"]["temperature"]
    assert (sel["selected_by"], sel["value"]) == ("fixed", 0.7)
    assert set(sel["per_measure"].values()) == {0.7}
    rec = json.loads((tmp_path / "t" / "samples.jsonl").open().readline())
    assert rec["temperature"] == 0.7 and "bs-msp" not in rec["measures"]


def test_auto_clusterer_with_relation(data_dir, tmp_path, monkeypatch, caplog):
    """'auto' resolving to a relation-less clusterer must not choke on --semantic_relation."""
    import gnll.semantic as semantic

    monkeypatch.setattr(semantic, "default_clusterer_name", lambda *a, **k: "exact")
    conf = cfg(
        data_dir, tmp_path / "a", clusterer="auto", semantic_relation="loose", temperature=1.0
    )
    Evaluator(conf, model=FakeModel()).run()
    comps = json.loads((tmp_path / "a" / "components.json").read_text())
    assert comps["clusterer"]["clusterer"] == "exact"
    assert "semantic_relation loose ignored" in caplog.text


def test_resume_after_exception_gives_identical_results(data_dir, tmp_path):
    ref = Evaluator(cfg(data_dir, tmp_path / "ref"), model=FakeModel()).run()
    crashing = FakeModel(fail_after=9)
    with pytest.raises(RuntimeError, match="injected"):
        Evaluator(cfg(data_dir, tmp_path / "run"), model=crashing).run()
    assert not (tmp_path / "run" / "results.json").exists()
    done_before = sum(crashing.calls.values())
    resumed = FakeModel()
    res = Evaluator(cfg(data_dir, tmp_path / "run", resume=True), model=resumed).run()
    assert res == ref
    assert (tmp_path / "run" / "results.json").read_bytes() == (
        tmp_path / "ref" / "results.json"
    ).read_bytes()
    assert (tmp_path / "run" / "samples.jsonl").read_bytes() == (
        tmp_path / "ref" / "samples.jsonl"
    ).read_bytes()
    # nothing that reached the disk was generated again
    full = FakeModel()
    assert Evaluator(cfg(data_dir, tmp_path / "ref2"), model=full).run() == ref
    assert done_before + sum(resumed.calls.values()) == sum(full.calls.values())


def test_resume_when_everything_is_cached_loads_no_model(data_dir, tmp_path, monkeypatch):
    Evaluator(cfg(data_dir, tmp_path / "r"), model=FakeModel()).run()
    first = (tmp_path / "r" / "results.json").read_bytes()

    def boom(*a, **k):
        raise AssertionError("model must not be loaded")

    monkeypatch.setattr("gnll.backends.load_model", boom)
    Evaluator(cfg(data_dir, tmp_path / "r", resume=True)).run()
    assert (tmp_path / "r" / "results.json").read_bytes() == first


def test_changed_prompt_or_model_is_refused_on_resume(data_dir, tmp_path):
    Evaluator(cfg(data_dir, tmp_path / "r", measures=["g-nll"]), model=FakeModel()).run()
    with pytest.raises(FingerprintMismatchError, match="model"):
        Evaluator(
            cfg(data_dir, tmp_path / "r", model="other", measures=["g-nll"], resume=True),
            model=FakeModel("other"),
        ).run()
    with pytest.raises(FingerprintMismatchError, match="prompt_prefix|split_seed"):
        Evaluator(
            cfg(data_dir, tmp_path / "r", seed=1, measures=["g-nll"], resume=True),
            model=FakeModel(),
        ).run()
    # With --overwrite (and only then) the directory is started over.
    Evaluator(
        cfg(data_dir, tmp_path / "r", seed=1, measures=["g-nll"], overwrite=True),
        model=FakeModel(),
    ).run()


def test_extending_measures_on_resume_reuses_greedy(data_dir, tmp_path):
    Evaluator(cfg(data_dir, tmp_path / "r", measures=["g-nll"]), model=FakeModel()).run()
    m = FakeModel()
    Evaluator(
        cfg(data_dir, tmp_path / "r", measures=["g-nll", "pe"], temperature=1.0, resume=True),
        model=m,
    ).run()
    assert "greedy" not in m.calls and m.calls["sample"] == 48


def test_judge_and_agreement(data_dir, tmp_path):
    judge = FakeJudge("fake-judge")
    res = Evaluator(
        cfg(
            data_dir,
            tmp_path / "j",
            judge="fake-judge",
            measures=["g-nll", "d-se"],
            temperature=1.0,
            tasks=["triviaqa_short", "triviaqa_long"],
        ),
        model=FakeModel(),
        judge=judge,
    ).run()
    short = res["tasks"]["triviaqa_short"]
    assert short["correctness"] == ["f1", "judge"]
    assert res["tasks"]["triviaqa_long"]["correctness"] == ["judge", "contains"]
    jm = short["metrics"]["judge"]
    assert jm["n"] + jm["n_undecided"] == 24
    assert "f1_vs_judge" in short["agreement"]
    assert short["agreement"]["f1_vs_judge"]["n"] == jm["n"]
    rec = json.loads((tmp_path / "j" / "samples.jsonl").open().readline())
    assert rec["correctness"]["judge"]["judge"] == "fake-judge"
    assert rec["correctness"]["judge"]["detail"] in ("yes", "no", "unparseable")
    assert "Agreement between correctness metrics" in (tmp_path / "j" / "table.md").read_text()


def test_table_cli_merges_runs(data_dir, tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    Evaluator(cfg(data_dir, tmp_path / "a", measures=["g-nll"]), model=FakeModel("model-a")).run()
    Evaluator(
        cfg(data_dir, tmp_path / "b", model="model-b", measures=["g-nll"]),
        model=FakeModel("model-b"),
    ).run()
    result = CliRunner().invoke(app, ["table", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "| fake-lm | svamp_short | F1 |" in result.output
    assert "| model-b | triviaqa_short | F1 |" in result.output
    assert "**Average**" in result.output
    bad = CliRunner().invoke(app, ["table", str(tmp_path / "nothing")])
    assert bad.exit_code == 2


def test_eval_cli_with_patched_loader(data_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    monkeypatch.setattr("gnll.backends.load_model", lambda name, **kw: FakeModel(name))
    out = tmp_path / "cli"
    args = [
        "eval",
        "--model",
        "fake-lm",
        "--tasks",
        "svamp_short,nq_open_short",
        "--limit",
        "10",
        "--output_path",
        str(out),
        "--data_dir",
        str(data_dir),
        "--measures",
        "g-nll,ln-g-nll",
        "--no-progress",
        "--no-plots",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| fake-lm | svamp_short | F1 | 10 |" in result.output
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["measures"] == ["g-nll", "ln-g-nll"]
    assert results["versions"]["python"]
    bad = CliRunner().invoke(app, ["eval", "--tasks", "nope", "--output_path", str(out)])
    assert bad.exit_code != 0 and "unknown task" in bad.output


SUBPROCESS_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from fakes import FakeModel, cfg
    from pathlib import Path
    from gnll.evaluation.run.runner import Evaluator
    Evaluator(cfg(Path({data!r}), Path({out!r})), model=FakeModel(delay=0.15)).run()
    """
)


@pytest.mark.e2e
def test_resume_after_kill_gives_identical_results(data_dir, tmp_path):
    ref = Evaluator(cfg(data_dir, tmp_path / "ref"), model=FakeModel()).run()
    out = tmp_path / "killed"
    script = SUBPROCESS_SCRIPT.format(
        tests=str(Path(__file__).resolve().parents[1]), data=str(data_dir), out=str(out)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": "0"}
    )
    # kill once the first task's eval split has started (some held-out and eval records on disk)
    kill_when_eval_starts(proc, out, wait=120)
    res = Evaluator(cfg(data_dir, out, resume=True), model=FakeModel()).run()
    assert res == ref
    assert (out / "results.json").read_bytes() == (tmp_path / "ref" / "results.json").read_bytes()


def test_config_validation():
    with pytest.raises(ValueError, match="unknown measure"):
        EvalConfig(model="m", tasks=["svamp_short"], output_path="x", measures=["entropy"])
    with pytest.raises(ValueError, match="judge is needed by correctness metric"):
        EvalConfig(model="m", tasks=["svamp_short"], output_path="x", correctness=["judge"])
    c = EvalConfig(
        model="m", tasks=["svamp_short"], output_path="x", measures=["g-nll", "bs-msp"], beams=0
    )
    assert c.active_measures == ["g-nll"] and not c.needs_samples


def test_table_says_when_the_heldout_pool_could_not_choose(data_dir, tmp_path):
    from gnll.evaluation.results.tables import render_table

    res = Evaluator(cfg(data_dir, tmp_path / "h", beams=0), model=FakeModel()).run()
    table = render_table([res])
    assert "| held-out, per-measure |" in table  # the fake model's held-out pool has both classes
    sel = res["tasks"]["triviaqa_short"]["temperature"]
    for c in sel["candidates"].values():
        c["mean_auroc"] = None  # as written for a pool with one correctness class
    table = render_table([res])
    assert "default (held-out AUROC undefined)" in table
