"""``gnll.evaluate``: the evaluation protocol in memory, on the runner tests' scripted model."""

from __future__ import annotations

import json
import tempfile

import pytest
from fakes import FakeModel, cfg

import gnll
from gnll.evaluation import Evaluation, evaluate
from gnll.evaluation.results.tables import render_table
from gnll.evaluation.run.runner import Evaluator

OPTIONS = dict(beams=3, samples=4, chunk_size=8, heldout_size=16, clusterer="exact", n_boot=50)


def test_evaluate_returns_what_a_run_directory_would_hold_and_leaves_nothing(
    data_dir, tmp_path, monkeypatch
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # torch puts its compile cache under the temp dir the first time a process asks for it: not ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-cache"))
    ev = evaluate(
        FakeModel(), "triviaqa_short,svamp_short", limit=24, data_dir=str(data_dir), **OPTIONS
    )
    assert isinstance(ev, Evaluation)
    assert not list(scratch.iterdir())  # the temporary run directory is gone

    ref = Evaluator(cfg(data_dir, tmp_path / "ref"), model=FakeModel()).run()
    assert ev.results["tasks"] == ref["tasks"]
    ref_samples = [json.loads(x) for x in (tmp_path / "ref" / "samples.jsonl").open()]
    assert ev.samples == ref_samples and len(ev.samples) == 48
    assert ev.table() == (tmp_path / "ref" / "table.md").read_text()


def test_evaluate_is_the_top_level_entry_point_and_refuses_run_directory_options(data_dir):
    assert gnll.evaluate is evaluate
    with pytest.raises(TypeError, match="output_path"):
        evaluate(FakeModel(), "svamp_short", output_path="runs/x")
    with pytest.raises(TypeError, match="resume"):
        evaluate(FakeModel(), "svamp_short", resume=True)
    ev = evaluate(
        FakeModel(), ["svamp_short"], limit=10, data_dir=str(data_dir), measures=["g-nll"]
    )
    assert ev.results["tasks"]["svamp_short"]["metrics"]["f1"]["n"] == 10
    assert set(ev.samples[0]["measures"]) == {"g-nll"}


def test_render_table_sections_are_the_table_in_parts(data_dir):
    ev = evaluate(FakeModel(), "svamp_short", limit=24, data_dir=str(data_dir), **OPTIONS)
    whole = render_table([ev.results])
    head = render_table([ev.results], sections=("notes", "auroc"))
    assert whole.startswith(head.rstrip("\n")) and "## AUROC averaged" not in head
    assert "## AUROC (↑)" in head and "## Sampling temperature" in whole
    with pytest.raises(ValueError, match="unknown table sections"):
        render_table([ev.results], sections=["bogus"])


def test_gnll_eval_prints_the_table_head_from_its_results_not_from_table_md(
    data_dir, tmp_path, monkeypatch
):
    from typer.testing import CliRunner

    from gnll.cli.main import app
    from gnll.evaluation.results.report import load_results

    monkeypatch.setattr("gnll.backends.load_model", lambda name, **kw: FakeModel(name))
    out = tmp_path / "cli"
    args = ["eval", "--model", "fake-lm", "--tasks", "svamp_short", "--limit", "10"]
    args += ["--output_path", str(out), "--data_dir", str(data_dir), "--measures", "g-nll"]
    args += ["--no-progress", "--no-plots", "--verbose"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    head = render_table([load_results(out)], sections=("notes", "auroc")).rstrip()
    assert head in result.output and "AUROC averaged" not in result.output
    assert "'total'" in result.output  # --verbose: this invocation's timings, from the evaluator
