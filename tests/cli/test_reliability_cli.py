"""Issue 15, point 2: one error boundary per command, options checked before the model loads,
untrusted text printed as text (no rich markup, no terminal escapes)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gnll.backends.base import Capabilities, Generation, Model
from gnll.cli._errors import safe_text
from gnll.cli.main import app

runner = CliRunner()


class EchoModel(Model):
    """Answers with a fixed text (which may be hostile)."""

    capabilities = Capabilities()  # beams, scoring, terminator, tempered log-probs

    name = "echo"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        n = config.num_sequences if config is not None else 1
        gen = Generation(self.text, [1, 2], [self.text[:3], self.text[3:]], [-0.1, -0.2], "stop")
        return [[gen] * n for _ in prompts]

    def render_prompt(self, prompt: str) -> str:
        return prompt

    def score(self, prompts, answers, **kwargs):  # pragma: no cover - not used by ask
        raise NotImplementedError


def _loader(text: str = "Paris"):
    def load(name, **kwargs):
        return EchoModel(text)

    return load


def _no_model(*a, **k):
    raise AssertionError("the model must not be loaded for invalid options")


def _ask(monkeypatch, loader, *args):
    monkeypatch.setattr("gnll.load_model", loader)
    return runner.invoke(app, ["ask", *args])


def test_markup_in_a_question_is_printed_as_text(monkeypatch):
    result = _ask(monkeypatch, _loader("[red]Paris[/red] [/b]"), "Why [/b] is [bold]x[/bold]?")
    assert result.exit_code == 0, result.output
    assert "Q: Why [/b] is [bold]x[/bold]?" in result.output
    assert "A: [red]Paris[/red] [/b]" in result.output


def test_terminal_escape_sequences_are_neutralised(monkeypatch):
    hostile = "Paris\x1b]0;pwned\x07\x1b[2J\u202e"
    result = _ask(monkeypatch, _loader(hostile), "Capital\x1b[31m of France?")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\u202e" not in result.output
    assert "Capital\\x1b[31m of France?" in result.output
    assert safe_text("a\tb\nc\rd\x9b") == "a\tb\nc\\x0dd\\x9b"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--samples", "0", "--measures", "pe"], "--samples"),
        (["--temperature", "0", "--measures", "pe"], "--temperature"),
        (["--temperature", "nan", "--measures", "pe"], "--temperature"),
        (["--max_new_tokens", "-5"], "--max_new_tokens"),
        (["--max-new-tokens", "0"], "--max_new_tokens"),  # was silently 50
        (["--beams", "0", "--measures", "bs-msp"], "--beams"),
    ],
)
def test_invalid_options_are_refused_before_the_model_loads(monkeypatch, args, option):
    result = _ask(monkeypatch, _no_model, "Q?", *args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("exc", "code", "words"),
    [
        (ValueError("no such checkpoint 'x'"), 2, "no such checkpoint"),
        (FileNotFoundError(2, "No such file", "/nowhere/model"), 2, "FileNotFoundError"),
        (RuntimeError("kaboom"), 1, "bug"),
        (MemoryError(), 1, "max_batch_tokens"),
        (TimeoutError("read timed out"), 1, "server"),
        (OSError(28, "No space left on device"), 1, "disk"),
    ],
)
def test_errors_are_one_clear_line_with_the_right_exit_status(monkeypatch, exc, code, words):
    def load(name, **kwargs):
        raise exc

    result = _ask(monkeypatch, load, "Q?")
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    # `gnll ask` first says what it loads; then the one error line.
    assert result.output.split("\n", 1)[1].startswith("error: ")
    assert words in result.output
    # A failure points at --debug; a usage error's one line is the whole story (issue: the hint
    # after clean usage errors read as if something had gone wrong inside gnll).
    assert ("--debug" in result.output) is (code == 1)
    debug = _ask(monkeypatch, load, "Q?", "--debug")
    assert debug.exit_code == code and "Traceback (most recent call last)" in debug.output


def test_out_of_memory_from_torch_is_a_failure_with_a_remedy(monkeypatch):
    import torch

    def load(name, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    result = _ask(monkeypatch, load, "Q?")
    assert result.exit_code == 1 and "max_batch_tokens" in result.output


# api_key is a key of the openai backend (an unknown key for hf is refused before the load).
OPENAI_ARGS = "backend=openai,base_url=http://127.0.0.1:9/v1,api_key=sk-12345678"


def test_secrets_are_blanked_in_errors_and_tracebacks(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")

    def load(name, **kwargs):
        raise RuntimeError(
            f"server said: bad key {kwargs.get('api_key')} (env sk-from-the-environment)"
        )

    for extra in ([], ["--debug"]):
        result = _ask(monkeypatch, load, "Q?", "--model_args", OPENAI_ARGS, *extra)
        assert result.exit_code == 1
        assert "sk-12345678" not in result.output and "sk-from-the" not in result.output
        assert "<redacted>" in result.output


def test_eval_errors_go_through_the_boundary(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["eval", "--tasks", "svamp_short", "--data_dir", str(tmp_path / "none"),
         "--output_path", str(out), "--measures", "g-nll"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "no local copy of svamp" in result.output and "Traceback" not in result.output


def test_every_command_has_the_boundary_and_debug():
    for info in app.registered_commands:
        assert getattr(info.callback, "__gnll_boundary__", False), info.name
        result = runner.invoke(app, [info.name, "--help"])
        assert result.exit_code == 0 and "--debug" in result.output, info.name


def test_option_strings_stay_verbatim():
    from gnll.cli._args import model_kwargs

    args = model_kwargs("backend=openai,base_url=http://127.0.0.1:1/v1,api_key=1e3,timeout=5")
    assert args["api_key"] == "1e3"  # not the number 1000.0
    assert args["timeout"] == 5.0


def test_file_names_with_markup_are_printed_as_text(tmp_path):
    missing = tmp_path / "in[/b]put.jsonl"
    result = runner.invoke(app, ["score", "-i", str(missing), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2, result.output
    assert "in[/b]put.jsonl" in result.output and "Traceback" not in result.output


def test_score_refuses_max_new_tokens_0_before_loading(tmp_path, monkeypatch):
    monkeypatch.setattr("gnll.load_model", _no_model)
    src = tmp_path / "in.jsonl"
    src.write_text('{"question": "Q?", "answer": "A"}\n')
    args = ["score", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--max-new-tokens", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--max_new_tokens must be >= 1" in result.output
