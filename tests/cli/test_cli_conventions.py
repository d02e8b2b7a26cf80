"""The CLI's conventions: --version, -h, one spelling per option on every command (the other
accepted as a hidden alias), help text that is not eaten as markup, clear model errors."""

from __future__ import annotations

import json
import time

import pytest
import typer
from typer.testing import CliRunner

from gnll.cli._conventions import canonical
from gnll.cli.main import app

runner = CliRunner()
COMMANDS = ["ask", "eval", "table", "simulate", "score", "generate", "calibrate", "serve", "doctor"]


def _commands():
    return typer.main.get_command(app).commands


def test_version_and_short_help():
    from gnll import __version__

    for flag in ("--version", "-V"):
        res = runner.invoke(app, [flag])
        assert res.exit_code == 0 and res.stdout.strip() == f"gnll {__version__}"
    for name in COMMANDS:
        res = runner.invoke(app, [name, "-h"])
        assert res.exit_code == 0, (name, res.output)
        assert f"gnll {name}" in res.stdout


def test_python_dash_m_gnll_is_the_gnll_command():
    import runpy
    import sys

    argv = sys.argv
    sys.argv = ["gnll", "--version"]
    try:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_module("gnll", run_name="__main__")
    finally:
        sys.argv = argv
    assert exit_.value.code in (0, None)


def test_every_option_has_one_canonical_name():
    for name, cmd in _commands().items():
        for param in cmd.params:
            names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
            longs = [o for o in names if o.startswith("--")]
            assert all(canonical(o) == o for o in longs), (name, names)
            assert len(longs) == len(set(longs)), (name, names)
            if param.param_type_name == "option":  # one long name (+ its --no_ form)
                assert len(param.opts) - sum(not o.startswith("--") for o in param.opts) == 1


def test_resume_listed_once_and_heldout_help_not_eaten_as_markup():
    res = runner.invoke(app, ["eval", "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert res.exit_code == 0
    named = [line.strip("│ ").split()[0] for line in res.stdout.splitlines() if "│ --" in line]
    assert named.count("--resume") == 1
    # a plain flag: no "--no_resume" twin and no "[default: no_resume]"; texts name the option
    assert "no_resume" not in res.stdout and "OUTPUT_PATH" not in res.stdout
    assert "min(100, limit)" in res.stdout


def test_score_accepts_the_spellings_ask_and_eval_accept(tmp_path, monkeypatch):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"question": "Q?", "answer": "A"}) + "\n")

    def no_model(name, **kw):
        raise KeyError("no model in this test")

    monkeypatch.setattr("gnll.load_model", no_model)
    for spelling in (
        ["--max_new_tokens", "5", "--batch_size", "2", "--chunk_size", "3", "--raw_prompt"],
        ["--max-new-tokens", "5", "--batch-size", "2", "--chunk-size", "3", "--raw-prompt"],
        ["--max_new_tokens=5", "--output_path", str(tmp_path / "o.jsonl")],
    ):
        args = ["score", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"), *spelling]
        res = runner.invoke(app, args)
        assert "No such option" not in res.output, res.output
        assert "cannot load model" in res.output  # parsed; failed only at the (faked) load


def test_output_path_is_an_alias_of_output_everywhere(tmp_path):

    run = tmp_path / "run"
    run.mkdir()
    # gnll table fails on a missing results.json, but only after parsing the output option.
    for flag in ("--output", "-o", "--output_path", "--output-path"):
        res = runner.invoke(app, ["table", str(run), flag, str(tmp_path / "t.md")])
        assert "No such option" not in res.output and "results.json not found" in res.output


def test_unknown_model_args_key_lists_the_known_keys():
    res = runner.invoke(app, ["ask", "Q?", "--model_args", "dtype=float32,foo=1"])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "unknown key 'foo'" in text and "dtype" in text and "batch_size" in text


@pytest.mark.parametrize("name,env", [("smollm3", {}), ("org/not-cached", {"HF_HUB_OFFLINE": "1"})])
def test_mistyped_model_name_answers_at_once_with_the_embedded_names(name, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.perf_counter()
    res = runner.invoke(app, ["ask", "Q?", "--model", name])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "not an embedded model (smollm2-135m-instruct, gemma-3-270m)" in text
    assert "not a local path and not in the Hugging Face cache" in text
    assert time.perf_counter() - t0 < 30  # no minute of hub retries (generous for a busy machine)


def test_ask_says_it_is_loading_the_model_on_stderr(monkeypatch):
    from tests.scoring.test_api_ask import ScriptedModel

    monkeypatch.setattr("gnll.load_model", lambda name, **kw: ScriptedModel())
    res = runner.invoke(app, ["ask", "Q?", "--json"])
    assert res.exit_code == 0, res.output
    assert "loading smollm2-135m-instruct" in res.stderr
    json.loads(res.stdout)  # stdout stays one JSON object


def test_docs_list_every_model_args_key():
    from pathlib import Path

    from gnll.cli._args import model_arg_keys

    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    section = doc.split("### `--model_args` keys", 1)[1].split("\n## ", 1)[0]
    for backend in ("hf", "openai"):
        missing = [k for k in model_arg_keys(backend) if k != "backend" and f"`{k}`" not in section]
        assert not missing, (backend, missing)


def test_unreachable_hub_is_one_short_network_failure(monkeypatch):
    import huggingface_hub

    calls = []

    def no_network(name, **kw):
        calls.append(kw.get("timeout"))
        raise OSError("Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "model_info", no_network)
    res = runner.invoke(app, ["ask", "Q?", "--model", "org/not-cached"])
    assert res.exit_code == 1  # a network failure, not a usage error
    assert "the hub cannot be reached" in " ".join(res.output.split())
    assert calls == [pytest.approx(5.0)]  # one request with a short timeout, no retries
