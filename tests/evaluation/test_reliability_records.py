"""Issue 15, points 1 and 4: what run records hold (no secrets) and what a resume may change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeJudge, FakeModel, cfg

from gnll.backends.identity import is_secret, model_identity, outcome_args, redact
from gnll.evaluation.run.runner import Evaluator, FingerprintMismatchError

SECRETS = ("sk-live-1e3", "hf_SeCrEt", "pa55word")


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_secrets_never_reach_the_run_directory(data_dir, tmp_path):
    out = tmp_path / "run"
    args = {"api_key": SECRETS[0], "hf_token": SECRETS[1], "batch_size": 4}
    Evaluator(
        cfg(
            data_dir,
            out,
            model_args=args,
            judge="fake-judge",
            judge_args={"password": SECRETS[2]},
            correctness=["f1", "judge"],
        ),
        model=FakeModel(),
        judge=FakeJudge("fake-judge"),
    ).run()
    blob = _all_bytes(out)
    assert b"results.json" not in blob and (out / "results.json").exists()
    for secret in SECRETS:
        assert secret.encode() not in blob, secret
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["model_args"] == {
        "api_key": "<redacted>",
        "hf_token": "<redacted>",
        "batch_size": 4,
    }
    fp = json.loads((out / "tasks" / "svamp_short" / "fingerprint.json").read_text())
    assert fp["model_args"] == {}  # neither secrets nor throughput knobs


def test_throughput_knobs_may_change_on_resume(data_dir, tmp_path):
    out = tmp_path / "run"
    first = FakeModel()
    Evaluator(cfg(data_dir, out, model_args={"max_batch_tokens": 8192}), model=first).run()
    ref = (out / "samples.jsonl").read_bytes()
    again = FakeModel()
    # the documented remedy after an out-of-memory error: lower the budget and resume
    Evaluator(
        cfg(data_dir, out, model_args={"max_batch_tokens": 1024, "batch_size": 2}, resume=True),
        model=again,
    ).run()
    assert sum(again.calls.values()) == 0  # everything came from the caches
    assert (out / "samples.jsonl").read_bytes() == ref
    with pytest.raises(FingerprintMismatchError, match=r"model_args\.dtype"):
        Evaluator(
            cfg(data_dir, out, model_args={"dtype": "bfloat16"}, resume=True), model=FakeModel()
        ).run()


def test_model_identity_change_is_refused_with_the_diff(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    ident = {"kind": "embedded", "package_version": "1.0", "libraries": {"torch": "2.13.0"}}
    monkeypatch.setattr("gnll.evaluation.run.runner.model_identity", lambda name, args: ident)
    Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=FakeModel()).run()
    newer = {**ident, "package_version": "1.1"}
    monkeypatch.setattr("gnll.evaluation.run.runner.model_identity", lambda name, args: newer)
    with pytest.raises(FingerprintMismatchError) as err:
        Evaluator(cfg(data_dir, out, measures=["g-nll"], resume=True), model=FakeModel()).run()
    assert 'model_identity.package_version: "1.0" -> "1.1"' in str(err.value)


def test_unknown_hub_commit_later_known_is_not_a_change(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    ident = {"kind": "hub", "repo": "org/m", "revision": "main", "commit": None}
    monkeypatch.setattr("gnll.evaluation.run.runner.model_identity", lambda name, args: ident)
    Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=FakeModel()).run()
    known = {**ident, "commit": "a" * 40}
    monkeypatch.setattr("gnll.evaluation.run.runner.model_identity", lambda name, args: known)
    again = FakeModel()
    Evaluator(cfg(data_dir, out, measures=["g-nll"], resume=True), model=again).run()
    assert sum(again.calls.values()) == 0
    other = {**ident, "commit": "b" * 40}
    monkeypatch.setattr("gnll.evaluation.run.runner.model_identity", lambda name, args: other)
    with pytest.raises(FingerprintMismatchError, match="model_identity.commit"):
        # once known, the commit is recorded: a different one is refused
        Evaluator(cfg(data_dir, out, measures=["g-nll"], resume=True), model=FakeModel()).run()


def test_model_identity_covers_package_libraries_and_checkpoint(tmp_path):
    emb = model_identity("smollm2-135m-instruct")
    assert emb["kind"] == "embedded" and emb["package_version"]
    assert set(emb["libraries"]) == {"torch", "transformers", "tokenizers"}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "A"}')
    (ckpt / "model.safetensors").write_bytes(b"0" * 10)
    a = model_identity(str(ckpt))
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "B"}')
    b = model_identity(str(ckpt))
    assert a["kind"] == "local" and a != b  # a changed chat template is a different model
    assert str(tmp_path) not in json.dumps(a)  # identity by content, not by local path
    hub = model_identity("org/not-downloaded", {"revision": "v2"})
    assert hub["kind"] == "hub" and hub["revision"] == "v2" and hub["commit"] is None
    assert model_identity("m", {"backend": "openai", "api_key": "sk"}) == {
        "kind": "server",
        "backend": "openai",
        "model": "m",
    }


def test_secret_names():
    for k in ("api_key", "OPENAI_API_KEY", "apikey", "hf_token", "access-token", "password"):
        assert is_secret(k), k
    for k in ("max_batch_tokens", "max_new_tokens", "fast_tokenizer", "keywords", "device"):
        assert not is_secret(k), k
    assert redact({"a": {"token": "t"}, "api_key": None}) == {
        "a": {"token": "<redacted>"},
        "api_key": None,
    }
    assert outcome_args({"concurrency": 4, "timeout": 3, "chat_template": False}) == {
        "chat_template": False
    }


def test_cli_tracebacks_never_show_locals():
    from gnll.cli.main import app

    # typer versions allowed by the pin (>=0.12) default to showing every frame's locals
    assert app.pretty_exceptions_show_locals is False
