"""The decoding loop (jobs and watches) is the library's (:mod:`gnll.backends.decoding`): the server
only queues work for it, and ``gnll generate`` and the server build their jobs at its one job site."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gnll.backends import load_model
from gnll.backends.decoding import DecodingLoop
from gnll.cli.main import app
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app

SRC = Path(__file__).resolve().parents[2] / "src" / "gnll"

#: What running a decoding loop takes: a model's decoder (opened, stepped, rows added with a
#: watch), the prompt checks before a row joins, a reasoning model's answer-phase hook.
LOOP_CALLS = {"open_decoder", "step", "check_context", "answer_decoder", "generate_answers"}


def _calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name in LOOP_CALLS:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}()")
            # a row joining a decoder with its early-decision watch (a backend's own loop, such as
            # the grammar loop's generate_constrained, may be handed a watch: it runs the loop)
            found += [
                f"{path.relative_to(SRC)}:{node.lineno} add(watch=)"
                for kw in node.keywords
                if kw.arg == "watch" and name == "add"
            ]
    return found


def test_serving_runs_no_decoding_loop():
    """The server's engine is a queue in front of the library's loop: nothing in ``serving/``
    steps a decoder, adds watched rows or calls a reasoning model's answer-phase hook."""
    hits = [hit for path in sorted((SRC / "serving").rglob("*.py")) for hit in _calls(path)]
    assert hits == []
    # the loop is where it says it is
    assert {h.split()[1] for h in _calls(SRC / "backends" / "decoding.py")} >= {
        "open_decoder()",
        "step()",
        "add(watch=)",
        "generate_answers()",
    }


def test_jobs_are_constructed_in_one_place():
    """``Job(...)`` appears once in the source: inside :meth:`DecodingLoop.job`."""
    sites = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Job":
                    sites.append(f"{path.relative_to(SRC)}:{fn.name}")
    assert sites == ["backends/decoding.py:job"]


@pytest.fixture
def job_site(monkeypatch):
    """Every job built, as (prompts, greedy, with early decisions)."""
    built = []
    site = DecodingLoop.job

    def spy(self, prompts, config, **kw):
        job = site(self, prompts, config, **kw)
        built.append((list(prompts), config.strategy, job.early is not None))
        return job

    monkeypatch.setattr(DecodingLoop, "job", spy)
    return built


def test_gnll_generate_and_the_server_build_their_jobs_at_the_one_site(
    tiny_llama, tmp_path, job_site
):
    path = str(tiny_llama())
    policy = AbstentionPolicy(mode="refuse", threshold=0.5)
    lm = load_model(path, progress=False)
    served = build_inprocess_app(lm, ServeSettings(policy=policy))
    with TestClient(served) as client:
        body = {"model": lm.name, "prompt": "Q: why?\nA:", "max_tokens": 8}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
    assert job_site == [(["Q: why?\nA:"], "greedy", True)]

    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"question": "why?"}) + "\n")
    args = ["generate", "-i", str(inp), "-o", str(out), "--model", path, "--no-progress"]
    args += ["--max_new_tokens", "8", "--policy", "refuse", "--threshold", "0.5"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(job_site) == 2 and job_site[1][1:] == ("greedy", True)
    [row] = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["refused"] is True and row["early"] is True
