"""docs/quickstart.md, executed: every block marked ``<!-- run -->`` runs, in order, in one empty
directory, as a new user would paste it, and prints what the page says it prints.

The servers of the walkthrough are bounded (``timeout``), bound to 127.0.0.1 on free ports (the
page's 8000/8001 are swapped for them) and killed with their process group after their block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs.walkthrough import Block, runnable_blocks, used_before_written

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
BLOCK_TIMEOUT = 240  # seconds; a block that takes longer is a failure, not a hang
SERVER_LIFETIME = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bash(block: Block, ports: dict[str, str]) -> str:
    code = block.code
    for doc_port, port in ports.items():
        code = code.replace(f":{doc_port}", f":{port}").replace(
            f"--port {doc_port}", f"--port {port}"
        )
    code = code.replace("gnll serve ", f"timeout {SERVER_LIFETIME} gnll serve ")
    return "set -euo pipefail\n" + code


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: background servers die with it
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[timed out after {BLOCK_TIMEOUT} s]"
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def test_quickstart_marks_a_runnable_block_for_every_job():
    blocks = runnable_blocks(QUICKSTART)
    text = "".join(b.code for b in blocks)
    for command in (
        "gnll ask",
        "gnll serve --upstream",
        "gnll score",
        "gnll generate",
        "gnll calibrate",
        "--calibration",
        "gnll eval",
        "gnll.integrations.langchain",
        "gnll.integrations.dspy",
        "gnll.integrations.llamaindex",
        "litellm --config",
        "client.responses.create",
        "client.responses.stream",
        "client.messages.create",
        "client.messages.stream",
        "Runner.run_sync",
        "tools=[calculator]",
        "response_format=",
    ):
        assert command in text, f"no runnable block of docs/quickstart.md runs {command!r}"
    assert any(b.lang == "python" and b.file is None for b in blocks)
    assert all(b.lang in {"bash", "python"} for b in blocks)
    # score and generate refusing to write over an earlier output (and score over its own input)
    for command in ("gnll score", "gnll generate"):
        assert any(
            command in b.code and any("holds an earlier run" in e for e in b.expect) for b in blocks
        ), f"no runnable block shows {command} refusing to overwrite an earlier output"
    assert any("is the input file" in e for b in blocks for e in b.expect)


def test_quickstart_never_uses_a_file_before_the_page_shows_it():
    assert used_before_written(runnable_blocks(QUICKSTART)) == []


def test_quickstart_covers_escalate_streams_through_the_sdk_loop():
    blocks = runnable_blocks(QUICKSTART)
    runs = [b for b in blocks if "--policy escalate" in b.code]
    assert runs and any("escalated: True" in e for e in runs[0].expect)
    used = {b.file: b for b in blocks if b.file and b.file in runs[0].code}
    assert any("chunk.choices[0]" in b.code and "stream=True" in b.code for b in used.values())


@pytest.mark.e2e
@pytest.mark.server
def test_quickstart_runs_end_to_end(tmp_path):
    env = dict(os.environ)
    env.pop("GNLL_DATA_DIR", None)  # a reader's machine has no data files: the shipped sample
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
        NO_COLOR="1",
        COLUMNS="120",
    )
    ports = {"8000": str(_free_port()), "8001": str(_free_port())}
    blocks = runnable_blocks(QUICKSTART)
    for block in blocks:  # strictly in page order, as a reader pastes them
        if block.file:
            code = block.code
            for doc_port, port in ports.items():
                code = code.replace(f":{doc_port}", f":{port}")
            (tmp_path / block.file).write_text(code, encoding="utf-8")
            continue
        where = f"docs/quickstart.md:{block.line}"
        start = time.perf_counter()
        if block.lang == "python":
            script = tmp_path / f"block_{block.line}.py"
            script.write_text(block.code, encoding="utf-8")
            res = _run([sys.executable, str(script)], tmp_path, env)
        else:
            res = _run(["bash", "-c", _bash(block, ports)], tmp_path, env)
        print(f"{where}: exit {res.returncode} in {time.perf_counter() - start:.1f} s")
        assert res.returncode == 0, f"{where} exited {res.returncode}:\n{res.stdout[-3000:]}"
        for want in block.expect:
            assert want in res.stdout, f"{where} did not print {want!r}:\n{res.stdout[-3000:]}"
