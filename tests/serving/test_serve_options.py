"""The library owns gnll serve's option rules: AbstentionPolicy, ServeSettings, check_escalation,
build_inprocess_app and build_proxy_app raise what the CLI used to check itself, naming parameters
(the CLI names its options for them); and `cascade.json` is an artifact of gnll.calibration that
`gnll serve --cascade` takes directly, refused for another prompt format unless told."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from serve_helpers import ScriptedModel, escalating
from typer.testing import CliRunner

import gnll
from gnll._util.validation import ParameterError
from gnll.calibration import CalibrationFormatError, Calibrator
from gnll.calibration.cascade import FORMAT, CascadeThreshold
from gnll.cli.main import app
from gnll.serving import (
    AbstentionPolicy,
    ServeSettings,
    build_inprocess_app,
    build_proxy_app,
    check_escalation,
)

runner = CliRunner()


def _calibrator() -> Calibrator:
    g = np.linspace(0, 5, 300)
    return Calibrator(target_coverage=None).fit(g, g < 2)


def _cascade(tmp_path, *, prompt_format="instruction", threshold=1.0, measure="g-nll"):
    fitted = CascadeThreshold(
        0.6,
        0.1,
        threshold,
        0.3,
        0.62,
        0.61,
        math.isfinite(threshold),
        "LTT",
        meta={
            "measure": measure,
            "prompt_format": prompt_format,
            "small": {"run": "runs/small", "model": "scripted"},
            "large": {"run": "runs/large", "model": "big"},
        },
    )
    return fitted.save(tmp_path / "cascade.json")


@pytest.mark.parametrize(
    ("kwargs", "param", "others"),
    [
        ({"mode": "shout"}, "mode", ()),
        ({"threshold": math.inf}, "threshold", ()),
        ({"min_p_correct": 1.5, "calibrator": "cal"}, "min_p_correct", ()),
        ({"min_p_correct": 0.5}, "min_p_correct", ("calibrator", "threshold")),
        ({"rule": "accuracy"}, "rule", ("calibrator", "threshold")),
        ({"calibrator": "cal", "threshold": 1.0}, "threshold", ("calibrator",)),
        ({"calibrator": "cal", "rule": "coverage"}, "rule", ("min_p_correct",)),
    ],
)
def test_a_policy_names_the_parameter_it_refuses(kwargs, param, others):
    if kwargs.get("calibrator") == "cal":
        kwargs = {**kwargs, "calibrator": _calibrator()}
    with pytest.raises(ParameterError) as err:
        AbstentionPolicy(**kwargs)
    assert err.value.param == param and err.value.others == others
    assert str(err.value).startswith(param + " ") and "--" not in str(err.value)


def test_settings_refuse_a_policy_that_cannot_serve():
    with pytest.raises(ParameterError, match="needs calibrator or threshold") as err:
        ServeSettings(policy=AbstentionPolicy(mode="flag"))
    assert err.value.param == "mode"
    with pytest.raises(ParameterError, match="would refuse every answer: threshold -1"):
        ServeSettings(policy=AbstentionPolicy(mode="refuse", threshold=-1.0))
    with pytest.raises(ParameterError, match="max_request_bytes must be >= 1024"):
        ServeSettings(max_request_bytes=10)
    with pytest.raises(ParameterError, match="prompt_format"):
        ServeSettings(prompt_format="text")
    ServeSettings(policy=AbstentionPolicy(mode="flag", threshold=2.0))  # a working one


def test_escalation_rules_live_in_the_library():
    escalate = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=1.0))
    with pytest.raises(ParameterError, match="escalate_to is needed by mode 'escalate'"):
        check_escalation(escalate, None)
    with pytest.raises(ParameterError, match="needs mode 'escalate'"):
        check_escalation(ServeSettings(), "http://127.0.0.1:9/v1")
    with pytest.raises(ParameterError, match="must be an http"):
        check_escalation(escalate, "127.0.0.1:9")
    with pytest.raises(ParameterError, match="escalate_to is the upstream itself"):
        check_escalation(escalate, "http://h:1/v1", upstream="http://h:1/v1")
    # the app builders run the same checks
    with pytest.raises(ParameterError, match="escalate_to is needed"):
        build_inprocess_app(ScriptedModel(), escalate)
    with pytest.raises(ParameterError, match="escalate_to is needed"):
        build_proxy_app("http://127.0.0.1:9/v1", escalate)
    with pytest.raises(ParameterError, match="prompt_format 'instruction' needs an in-process"):
        build_proxy_app("http://127.0.0.1:9/v1", ServeSettings(prompt_format="instruction"))
    with pytest.raises(ParameterError, match="upstream must be an http"):
        build_proxy_app("localhost:9", ServeSettings())


def test_the_cli_names_its_options_for_the_library_errors(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model must not load when the options are refused")

    monkeypatch.setattr(gnll, "load_model", no_model)
    cases = [
        (["--policy", "refuse"], "--policy 'refuse' needs --calibration FILE or --threshold"),
        (["--min_p_correct", "0.5"], "--min_p_correct needs --calibration FILE"),
        (["--policy", "escalate", "--threshold", "1"], "--escalate-to is needed"),
        (["--escalate-to", "http://127.0.0.1:9/v1"], "--escalate-to needs --policy 'escalate'"),
        (["--upstream", "http://x/v1", "--prompt-format", "instruction"], "--prompt-format"),
        (["--threshold", "inf"], "--threshold must be a finite G-NLL value"),
        (
            ["--upstream", "http://h:1/v1", "--policy", "escalate", "--threshold", "1"]
            + ["--escalate-to", "http://h:1/v1"],
            "--escalate-to is the --upstream itself (http://h:1/v1)",
        ),
    ]
    for args, message in cases:
        res = runner.invoke(app, ["serve", *args])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output, (args, res.output)
        assert len([line for line in res.output.splitlines() if line.strip()]) == 1


def test_cascade_file_round_trip_and_format(tmp_path):
    path = _cascade(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and doc["prompt_format"] == "instruction"
    back = CascadeThreshold.load(path)
    assert back.threshold == 1.0 and back.prompt_format == "instruction"
    assert back.meta["small"]["model"] == "scripted" and back.meta["path"] == str(path)
    with pytest.raises(CalibrationFormatError, match="fitted on answers to 'instruction'"):
        CascadeThreshold.load(path, prompt_format="chat")
    with pytest.warns(gnll.calibration.CalibrationMismatchWarning, match="small model"):
        CascadeThreshold.load(path, model="other")
    # a file of the first version (no prompt format recorded) is read as fitted on an unknown one
    legacy = {k: v for k, v in doc.items() if k not in ("format", "prompt_format")}
    (tmp_path / "old.json").write_text(json.dumps({"kind": "gnll.cascade/1", **legacy}))
    assert CascadeThreshold.load(tmp_path / "old.json", prompt_format="chat").applies("chat")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "gnll-calibration/1"}))
    with pytest.raises(ValueError, match="not a gnll cascade file"):
        CascadeThreshold.load(tmp_path / "bad.json")


def test_a_cascade_policy_escalates_on_its_threshold_for_its_format_only(tmp_path):
    policy = AbstentionPolicy.from_cascade(_cascade(tmp_path, threshold=1.0))
    assert policy.mode == "escalate" and policy.threshold == 1.0
    assert policy.source.startswith("cascade.json: escalate when G-NLL > 1")
    assert policy.decide(1.5, "instruction") == (None, True)
    assert policy.decide(0.5, "instruction") == (None, False)
    assert policy.decide(1.5, "chat") == (None, None)  # fitted on another format: no decision
    told = AbstentionPolicy.from_cascade(_cascade(tmp_path), any_prompt_format=True)
    assert told.decide(1.5, "chat") == (None, True)
    # the server refuses it for chat requests of another format, unless told
    with pytest.raises(CalibrationFormatError, match="any_prompt_format"):
        ServeSettings(policy=policy)
    ServeSettings(policy=policy, prompt_format="instruction")
    ServeSettings(policy=told)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "flag"}, "cascade is a threshold for mode 'escalate'"),
        ({"threshold": 1.0}, "cascade cannot be given with calibrator or threshold"),
    ],
)
def test_a_cascade_is_an_escalation_threshold_alone(tmp_path, kwargs, match):
    fitted = CascadeThreshold.load(_cascade(tmp_path))
    with pytest.raises(ParameterError, match=match):
        AbstentionPolicy(cascade=fitted, **{"mode": "escalate", **kwargs})


def test_a_cascade_that_escalates_everything_or_gates_another_measure_is_refused(tmp_path):
    with pytest.raises(ParameterError, match="out of reach"):
        AbstentionPolicy.from_cascade(_cascade(tmp_path, threshold=-math.inf))
    with pytest.raises(ParameterError, match="gates on 'pe'"):
        AbstentionPolicy.from_cascade(_cascade(tmp_path, measure="pe"))


def test_serve_takes_cascade_json_and_refuses_it_for_chat_prompts(tmp_path, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model must not load when the options are refused")

    monkeypatch.setattr(gnll, "load_model", no_model)
    path = str(_cascade(tmp_path))
    res = runner.invoke(app, ["serve", "--cascade", path, "--escalate-to", "http://x:1/v1"])
    assert res.exit_code == 2
    assert "fitted on answers to 'instruction' prompts" in res.output
    assert "--prompt-format 'instruction'" in res.output and "--cascade-any-format" in res.output
    # another small model than the file's: one warning line at start-up, then the refusal
    assert "gnll serve: warning:" in res.output and "small model 'scripted'" in res.output
    res = runner.invoke(app, ["serve", "--cascade", path, "--threshold", "2"])
    assert res.exit_code == 2 and "--cascade cannot be given with --calibration or --threshold" in (
        res.output
    )


def test_serve_escalates_on_a_cascade_file(tmp_path):
    """The fitted threshold gates escalation end to end: the unsure answer (G-NLL 5) goes upstream."""
    from test_serve_cascade import BigModel

    class Asked(ScriptedModel):  # the question inside the instruction prompt decides the answer
        def generate(self, prompts, config=None, **kwargs):
            asked = ["unsure" if "unsure" in p else p for p in prompts]
            return super().generate(asked, config, **kwargs)

    policy = AbstentionPolicy.from_cascade(_cascade(tmp_path, threshold=1.0))
    settings = ServeSettings(policy=policy, prompt_format="instruction")

    def ask(srv, question):
        body = {"messages": [{"role": "user", "content": question}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
        return r.json()["choices"][0]["uncertainty"]

    with escalating(Asked(), BigModel(), settings) as srv:
        unsure, sure = ask(srv, "unsure"), ask(srv, "capital?")
        # a completion's prompt is text, not the format the threshold was fitted on: kept
        text = httpx.post(srv.url + "/v1/completions", json={"prompt": "unsure"}, timeout=30)
    assert unsure["answered_by"] == "big" and unsure["local"]["g_nll"] == pytest.approx(5.0)
    assert sure["answered_by"] == "scripted" and sure["abstain"] is False
    kept = text.json()["choices"][0]["uncertainty"]
    assert kept["answered_by"] == "scripted" and kept["abstain"] is None
