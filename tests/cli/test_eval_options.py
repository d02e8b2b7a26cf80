"""``gnll eval``: options in groups, mapped onto an ``EvalConfig`` that checks them itself."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from gnll._util.validation import ParameterError
from gnll.cli.main import app
from gnll.evaluation.run.config import EvalConfig

PANELS = ("Model and tasks", "Data", "Correctness", "Measures and sampling", "Run", "Engine")


def test_eval_help_groups_its_options():
    res = CliRunner().invoke(app, ["eval", "-h"], env={"COLUMNS": "120"})
    assert res.exit_code == 0
    heads = [line for line in res.output.splitlines() if line.startswith("╭─")]
    for panel in PANELS:
        assert any(f" {panel} " in h for h in heads), panel
    # every option of the command sits in a group (the general panel: --help, --debug)
    general = res.output.split("╭─ Options ")[1].split("╰")[0]
    assert set(re.findall(r"--[a-z][a-z_-]*", general)) == {"--help", "--debug"}


BASE = dict(model="m", tasks=["svamp_short"], output_path="x")


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"measures": ["entropy"]}, None, "unknown measure"),
        ({"correctness": ["judge"]}, "judge", "--judge is needed by correctness metric"),
        ({"correctness": ["bleu"]}, "correctness", "--correctness has unknown correctness metric"),
        ({"judge": "a,", "correctness": ["f1"]}, "judge", "--judge 'a,': an empty judge name"),
        ({"judge": "a,b", "judge_args": [{}, {}, {}]}, "judge_args", "gives 3 ';'-separated"),
        ({"beams": -1}, "beams", "--beams must be >= 0"),
        ({"samples": -1}, "samples", "--samples must be >= 0"),
        ({"temperature": 0.0}, "temperature", "--temperature must be positive"),
        ({"limit": 0}, "limit", "--limit must be >= 1"),
        ({"chunk_size": 0}, "chunk_size", "--chunk_size must be >= 1"),
        ({"temperature_scope": "run"}, "temperature_scope", "--temperature_scope must be one of"),
        ({"sample_logprobs": "x"}, "sample_logprobs", "--sample_logprobs must be one of"),
        ({"reference": "beam", "beams": 0}, "reference", "--reference beam needs --beams K >= 1"),
        ({"f1_rule": "x"}, "f1_rule", "--f1_rule must be one of"),
    ],
)
def test_eval_config_raises_what_gnll_eval_reports(fields, param, message):
    """The library names the field (a ParameterError, not a flag); the CLI names its option."""
    with pytest.raises(ValueError) as caught:
        EvalConfig(**BASE, **fields)
    if param is not None:
        assert isinstance(caught.value, ParameterError) and caught.value.param == param
        assert str(caught.value).startswith(param) and "--" not in str(caught.value)
    res = CliRunner().invoke(app, ["eval", *_flags(fields)])
    assert res.exit_code == 2 and message.split("'")[0][:20] in " ".join(res.output.split())
    assert message[:40] in " ".join(res.output.replace("│", " ").split())


def _flags(fields):
    args = ["--model", "m", "--tasks", "svamp_short", "--output_path", "x"]
    for k, v in fields.items():
        if k == "judge_args":
            v = ";".join("revision=main" for _ in v)
        elif isinstance(v, list):
            v = ",".join(v)
        args += [f"--{'bootstrap' if k == 'n_boot' else k}", str(v)]
    return args
