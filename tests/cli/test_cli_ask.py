"""`gnll ask` end to end on the default embedded model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gnll import measures
from gnll.cli.main import app
from gnll.evaluation.data.prompts import ask_prompt

runner = CliRunner()


def test_ask_prompt_is_the_evaluation_prompt_without_few_shot():
    from gnll.evaluation.data.datasets import Example
    from gnll.evaluation.data.prompts import BRIEF_LONG, BRIEF_SHORT, build_prompt, format_block

    for long, brief in ((False, BRIEF_SHORT), (True, BRIEF_LONG)):
        prompt = ask_prompt("Q?", long=long)
        assert prompt == build_prompt(brief, [], Example("x", "Q?", ("A",)))
        assert prompt == brief + "\n" + format_block(Example("x", "Q?", ("A",)))


@pytest.mark.model
def test_ask_json_reports_answer_and_measures(smollm):
    result = runner.invoke(
        app,
        [
            "ask",
            "What is the capital of France?",
            "--json",
            "--measures",
            "g-nll,ln-g-nll,pe,ln-pe",
            "--samples",
            "3",
            "--temperature",
            "1.0",
            "--max_new_tokens",
            "16",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"answer", "g_nll", "tokens", "token_logprobs", "ln_g_nll", "pe", "ln_pe"} <= set(record)
    assert "Paris" in record["answer"]
    assert record["g_nll"] == pytest.approx(measures.g_nll(record["token_logprobs"]))
    assert len(record["tokens"]) == len(record["token_logprobs"])
    assert len(record["samples"]) == 3
    assert record["pe"] == pytest.approx(
        measures.predictive_entropy(record["sample_token_logprobs"])
    )


@pytest.mark.model
def test_ask_every_measure_with_default_options(smollm):
    """Every measure at once, nothing but defaults (the semantic ones once failed on the clusterer)."""
    result = runner.invoke(
        app,
        ["ask", "What is the capital of France?", "--json", "--measures", ",".join(measures.ORDER)],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    samples, ids = record["sample_token_logprobs"], record["cluster_ids"]
    assert len(samples) == len(ids) == len(record["samples"]) == 10  # the --samples default
    assert len(record["beam_token_logprobs"]) == 5  # the --beams default
    expected = measures.compute(
        measures.ORDER,
        greedy=record["token_logprobs"],
        beams=record["beam_token_logprobs"],
        samples=samples,
        cluster_ids=ids,
    )
    for name, value in expected.items():
        assert record[name.replace("-", "_")] == pytest.approx(value), name


@pytest.mark.model
def test_ask_table_output(smollm):
    result = runner.invoke(app, ["ask", "What is the capital of France?", "--max_new_tokens", "16"])
    assert result.exit_code == 0, result.output
    assert "G-NLL" in result.stdout and "log-prob" in result.stdout


def test_ask_rejects_unknown_measure():
    result = runner.invoke(app, ["ask", "Q?", "--measures", "g-nll,bogus"])
    assert result.exit_code != 0
    assert "bogus" in result.output
