"""One prompt-rendering path with named formats: the same question and answer give the same G-NLL
on every surface that names the same format, and a calibration is refused for another format."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from fakes import ToyModel
from serve_helpers import ScriptedModel
from typer.testing import CliRunner

import gnll
from gnll.backends.base import DEFAULT_STOP
from gnll.backends.prompting import instruction_prompt, prompt_for
from gnll.calibration import CalibrationFormatError, Calibrator, load_calibration
from gnll.cli.main import app
from gnll.scoring import score
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

runner = CliRunner()
QUESTION = "What is the capital of France?"


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def _ask_json(*args: str) -> dict:
    res = runner.invoke(app, ["ask", QUESTION, "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def _score_cli(tmp_path, row: dict) -> dict:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(row) + "\n")
    res = runner.invoke(app, ["score", "-i", str(inp), "-o", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def _serve_chat(model, prompt_format: str) -> tuple[str, dict]:
    settings = ServeSettings(prompt_format=prompt_format)
    with ServerThread(build_inprocess_app(model, settings)) as srv:
        choice = (
            _client(srv)
            .chat.completions.create(
                model=model.name,
                messages=[{"role": "user", "content": QUESTION}],
                max_tokens=50,
                stop=list(DEFAULT_STOP),
                temperature=0,
            )
            .choices[0]
        )
    return choice.message.content.strip(), choice.uncertainty


@pytest.mark.model
@pytest.mark.parametrize("fmt", ["instruction", "chat"])
def test_same_question_and_answer_give_the_same_g_nll_on_every_surface(
    smollm, monkeypatch, tmp_path, fmt
):
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: smollm)
    asked = _ask_json("--prompt-format", fmt)
    answer, g_nll = asked["answer"], asked["g_nll"]
    assert asked["prompt_format"] == fmt and answer

    [lib] = score(smollm, [QUESTION], [answer], prompt_format=fmt)
    # gnll score names the format by the row's field: a question, or chat messages
    row = (
        {"question": QUESTION}
        if fmt == "instruction"
        else {"messages": [{"role": "user", "content": QUESTION}]}
    )
    cli = _score_cli(tmp_path, {**row, "answer": answer})
    served_answer, u = _serve_chat(smollm, fmt)

    assert cli["prompt_format"] == u["prompt_format"] == fmt
    assert served_answer == answer
    for value in (lib.nll, cli["nll"], u["g_nll"]):
        assert value == pytest.approx(g_nll, abs=1e-4)


@pytest.mark.model
def test_the_formats_differ(smollm):
    """Why the format is named: the same question and answer under another prompt is another number."""
    [a] = smollm.generate([prompt_for(QUESTION, "instruction")[0]])
    [ins] = score(smollm, [QUESTION], [a[0].text], prompt_format="instruction")
    [chat] = score(smollm, [QUESTION], [a[0].text], prompt_format="chat")
    assert abs(ins.nll - chat.nll) > 0.1


# ---------------------------------------------------------------------- calibrations and formats
def _calibration(tmp_path, prompt_format: str | None) -> str:
    rng = np.random.default_rng(0)
    g = rng.exponential(1.5, 500)
    cal = Calibrator(target_coverage=0.5, target_accuracy=None).fit(
        g, rng.uniform(size=500) < np.exp(-g)
    )
    cal.meta = {"measure": "g-nll", "prompt_format": prompt_format}
    return str(cal.save(tmp_path / f"{prompt_format}.json"))


def test_calibrate_records_the_format_of_its_data(tmp_path):
    scored = tmp_path / "scored.jsonl"
    rng = np.random.default_rng(1)
    rows = [
        {"prompt_format": "chat", "nll": float(s), "correct": bool(rng.uniform() < np.exp(-s))}
        for s in rng.exponential(1.0, 200)
    ]
    scored.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", str(scored), "-o", str(out), "--measure", "nll"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["prompt_format"] == "chat"
    res = runner.invoke(
        app,
        ["calibrate", str(scored), "-o", str(out), "--measure", "nll", "--prompt-format", "text"],
    )
    assert res.exit_code == 2 and "come from 'chat' prompts, not 'text'" in res.output


def test_a_calibration_is_refused_for_another_format(tmp_path):
    path = _calibration(tmp_path, "instruction")
    load_calibration(path, prompt_format="instruction")
    with pytest.raises(CalibrationFormatError, match="fitted on answers to 'instruction' prompts"):
        load_calibration(path, prompt_format="chat")
    # a file that does not say applies to anything (and the shipped files say instruction)
    load_calibration(_calibration(tmp_path, None), prompt_format="chat")
    shipped = load_calibration("auto", model="smollm2-135m-instruct")
    assert shipped.meta["prompt_format"] == "instruction"


def test_ask_refuses_a_calibration_of_another_format(monkeypatch, tmp_path):
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: ScriptedModel())
    path = _calibration(tmp_path, "instruction")
    res = runner.invoke(app, ["ask", QUESTION, "--prompt-format", "chat", "--calibration", path])
    assert res.exit_code == 2
    assert "fitted on answers to 'instruction' prompts" in res.output
    ok = runner.invoke(app, ["ask", QUESTION, "--calibration", path, "--json"])
    assert ok.exit_code == 0, ok.output
    assert 0 < json.loads(ok.output.strip().splitlines()[-1])["p_correct"] < 1


def test_serve_refuses_a_calibration_of_another_format(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model must not load when the options are refused")

    monkeypatch.setattr(gnll, "load_model", no_model)
    res = runner.invoke(app, ["serve", "--calibration", "auto", "--rule", "coverage"])
    assert res.exit_code == 2
    assert "pass --prompt-format instruction" in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1
    policy = AbstentionPolicy.from_calibration("auto", model="smollm2-135m-instruct")
    with pytest.raises(CalibrationFormatError):
        ServeSettings(policy=policy)
    ServeSettings(policy=policy, prompt_format="instruction")


def test_a_calibrated_server_gives_p_correct_only_for_its_format(tmp_path):
    policy = AbstentionPolicy.from_calibration(_calibration(tmp_path, "instruction"))
    settings = ServeSettings(policy=policy, prompt_format="instruction")
    model = ScriptedModel()
    with ServerThread(build_inprocess_app(model, settings)) as srv:
        c = _client(srv)
        chat = c.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "sure"}]
        ).choices[0]
        text = c.completions.create(model="scripted", prompt="sure").choices[0]
        with pytest.raises(openai.BadRequestError, match="one user message"):
            c.chat.completions.create(
                model="scripted",
                messages=[
                    {"role": "system", "content": "x"},
                    {"role": "user", "content": "sure"},
                ],
            )
    assert chat.uncertainty["prompt_format"] == "instruction"
    assert chat.uncertainty["p_correct"] is not None
    assert text.uncertainty["prompt_format"] == "text" and text.uncertainty["p_correct"] is None
    # the chat request was asked as gnll ask asks: the instruction around the question
    assert model.prompts[0] == instruction_prompt("sure")


def test_score_leaves_rows_of_another_format_uncalibrated(monkeypatch, tmp_path):
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: ToyModel())
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"question": "Who?", "answer": "me"}, {"prompt": "Who?", "answer": "me"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = _calibration(tmp_path, "instruction")
    res = runner.invoke(
        app, ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--calibration", path]
    )
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt_format"] for r in got] == ["instruction", "chat"]
    assert got[0]["p_correct"] is not None and got[1]["p_correct"] is None
    assert "1 row(s) have no p_correct" in res.output and "'chat'" in res.output
