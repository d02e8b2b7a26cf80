"""``gnll eval``: options in groups, mapped onto an ``EvalConfig`` that checks them itself."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

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
    ("fields", "message"),
    [
        ({"measures": ["entropy"]}, "unknown measure"),
        ({"correctness": ["judge"]}, "needs a judge model"),
        ({"correctness": ["bleu"]}, "unknown correctness metric"),
        ({"judge": "a,", "correctness": ["f1"]}, "an empty judge name"),
        ({"judge": "a,b", "judge_args": [{}, {}, {}]}, "gives 3 ';'-separated sets for 2"),
        ({"beams": -1}, "--beams and --samples must be >= 0"),
        ({"temperature": 0.0}, "--temperature must be positive"),
        ({"limit": 0}, "--limit must be >= 1"),
        ({"chunk_size": 0}, "--chunk_size must be >= 1"),
        ({"temperature_scope": "run"}, "--temperature_scope must be one of"),
        ({"sample_logprobs": "x"}, "--sample_logprobs must be one of"),
        ({"reference": "beam", "beams": 0}, "--reference beam needs --beams K >= 1"),
        ({"f1_rule": "x"}, "--f1_rule must be one of"),
    ],
)
def test_eval_config_raises_what_gnll_eval_reports(fields, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**BASE, **fields)
    res = CliRunner().invoke(app, ["eval", *_flags(fields)])
    assert res.exit_code == 2 and message.split("'")[0][:20] in " ".join(res.output.split())


def _flags(fields):
    args = ["--model", "m", "--tasks", "svamp_short", "--output_path", "x"]
    for k, v in fields.items():
        if k == "judge_args":
            v = ";".join("revision=main" for _ in v)
        elif isinstance(v, list):
            v = ",".join(v)
        args += [f"--{'bootstrap' if k == 'n_boot' else k}", str(v)]
    return args
