"""The evaluation sample shipped inside gnll: loaded by default, licensed, the full files' own split."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from full_data import FULL_DATA, needs_full_data

from gnll.evaluation.data.datasets import DATASETS, load_dataset, resolve_source
from gnll.evaluation.data.embedded import EMBEDDED_DIR, SAMPLE_SIZES, SAMPLE_TASKS
from gnll.evaluation.data.tasks import TASKS, get_task
from gnll.evaluation.results.tables import _pool_source
from gnll.evaluation.run.config import EvalConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_data_env(monkeypatch):
    monkeypatch.delenv("GNLL_DATA_DIR", raising=False)


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_each_dataset_ships_its_pools(dataset, no_data_env):
    data = get_task(SAMPLE_TASKS[dataset]).load()
    assert data.data_info["source"] == "embedded"
    assert len(data.eval_idx) == SAMPLE_SIZES[dataset]
    assert (len(data.fewshot_idx), len(data.heldout_idx)) == (20, 100)
    assert len(data.examples) == SAMPLE_SIZES[dataset] + 120
    assert not set(data.fewshot_idx) & set(data.heldout_idx + data.eval_idx)
    assert len(data.fewshot) == data.task.num_fewshot


def test_without_files_the_sample_is_used_and_with_them_the_files(no_data_env, monkeypatch, tmp_path):
    assert resolve_source() == "embedded"
    assert resolve_source(data_dir=tmp_path) == resolve_source(data_path=tmp_path / "f") == "local"
    cfg = EvalConfig(model="m", tasks=["triviaqa_short"], output_path=tmp_path / "run")
    assert cfg.data_source == "embedded"  # resolved once, so the run records it
    monkeypatch.setenv("GNLL_DATA_DIR", str(tmp_path))
    assert resolve_source() == "local"
    with pytest.raises(ValueError, match="data source must be one of"):
        resolve_source("shared")
    with pytest.raises(ValueError, match="drop --data_dir"):
        load_dataset("svamp", data_dir=tmp_path, source="embedded")


def test_another_seed_keeps_the_evaluation_pool_and_redraws_the_others(no_data_env):
    base, other = (get_task("nq_open_short").load(seed=s) for s in (0, 7))
    assert {e.id for e in base.split("eval")} == {e.id for e in other.split("eval")}
    assert [e.id for e in base.fewshot] != [e.id for e in other.fewshot]
    assert "re-split with seed 7" in other.data_info["eval_pool"]


def test_the_table_says_the_numbers_come_from_the_sample(no_data_env):
    data = get_task("triviaqa_short").load()
    text = _pool_source({"data": data.data_info})
    assert "embedded sample, 520 of the triviaqa_unfiltered_validation.jsonl (11,313 questions)" in text


def test_licenses_and_attribution_ship_with_the_sample():
    attribution = (EMBEDDED_DIR / "ATTRIBUTION.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:LICENSE|README)[^`]+)`", attribution))
    assert {"LICENSE.triviaqa-Apache-2.0.txt", "LICENSE.svamp-MIT.txt"} <= named
    for name in named:
        assert (EMBEDDED_DIR / name).is_file(), name
    for dataset in DATASETS:
        assert f"`{dataset}.jsonl`" in attribution
    assert "CC BY-SA 3.0" in attribution and "Apache" in attribution and "MIT" in attribution
    # the package data globs take every one of those files into a wheel
    line = re.search(r'^"gnll\.evaluation\.data" = \[(.*)\]$', (ROOT / "pyproject.toml").read_text(), re.M)
    globs = re.findall(r'"([^"]+)"', line.group(1))
    for f in EMBEDDED_DIR.iterdir():
        if f.suffix != ".py" and f.name != "__pycache__":
            assert any(Path("embedded", f.name).match(g) for g in globs), f.name


@needs_full_data
@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_sample_asks_what_the_full_file_asks(name, no_data_env):
    full = get_task(name).load(data_dir=str(FULL_DATA))
    sample = get_task(name).load()
    n = len(sample.eval_idx)
    assert [e.id for e in sample.split("eval")] == [e.id for e in full.split("eval", n)]
    assert [e.id for e in sample.split("heldout")] == [e.id for e in full.split("heldout")]
    assert [sample.prompt(e) for e in sample.split("eval")] == [
        full.prompt(e) for e in full.split("eval", n)
    ]
    assert [e.answers for e in sample.split("eval")] == [e.answers for e in full.split("eval", n)]


@needs_full_data
def test_the_build_script_reproduces_the_shipped_files_byte_for_byte():
    path = ROOT / "scripts" / "build_embedded_sample.py"
    spec = importlib.util.spec_from_file_location("build_embedded_sample", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for dataset in DATASETS:
        rebuilt = "".join(script.sample_lines(dataset, str(FULL_DATA))).encode("utf-8")
        assert rebuilt == (EMBEDDED_DIR / f"{dataset}.jsonl").read_bytes(), dataset
