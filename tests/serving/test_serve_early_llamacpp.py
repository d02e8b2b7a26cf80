"""A real llama.cpp server (llama-cpp-python, scripts/test.sh builds it) stops generating when the
`gnll serve --upstream` proxy closes the stream at an exact early decision.

How it is told: the server process's CPU time. While it generates, it burns CPU; once the proxy
has disconnected, it must go idle although the answer it was asked for (up to 400 tokens, and at
least 120: checked first, then read to its end) is far from done. (A second request is no test here: llama-cpp-python interrupts a running request when a
new one arrives, whether or not the client of the first went away.)
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.server

MODEL = "smollm2-135m-instruct"
PROMPT = "Write a long story about a dragon who learns to cook. Chapter 1:"


def cpu_seconds(group: int) -> float:
    """CPU seconds used so far by the processes of a process group (the server runs under
    ``timeout``, in a session of its own)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == group:  # pgrp
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def busy_over(pid: int, seconds: float) -> float:
    start = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - start


def test_llamacpp_stops_generating_after_the_proxy_disconnects(llama_server):
    pid = llama_server.process.pid
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "temperature": 0}
    # Control: the answer runs on for at least 120 tokens, and the server burns CPU while it
    # generates. Its whole length (read to its end: greedy, so the proxied answer below is the
    # same) bounds the window below, which must lie inside it even on a fast host.
    with httpx.stream("POST", llama_server.base_url + "/completions", json={**body, "stream": True},
                      timeout=120) as r:  # fmt: skip
        t, lines = time.perf_counter(), r.iter_lines()
        chunks = 0
        while chunks < 120:
            line = next(lines)
            assert "[DONE]" not in line, f"the story ended after {chunks} tokens"
            chunks += line.startswith("data:")
        rate = chunks / (time.perf_counter() - t)
        generating = busy_over(pid, 1.5)
        for line in lines:  # the rest of the answer (the server ran on meanwhile)
            if "[DONE]" in line:
                break
            chunks += line.startswith("data:")
    long = chunks  # the answer's tokens (one a chunk)
    assert generating > 0.2, f"the server used {generating:.2f} s of CPU while generating"

    policy = AbstentionPolicy(mode="refuse", threshold=4.0)
    app = create_app(
        ProxyService(llama_server.base_url, timeout=120), ServeSettings(policy=policy, early=True)
    )
    with ServerThread(app) as px:
        t = time.perf_counter()
        u = httpx.post(px.url + "/v1/completions", json=body, timeout=120).json()["choices"][0][
            "uncertainty"
        ]
        took = time.perf_counter() - t
        assert u["early"] is True and u["refused"] is True
        assert u["decided_at_token"] < 100 and u["tokens_saved"] > 300
        # Had it gone on, the server would still be generating during the window below: the
        # window ends well before the answer's LONG-th token at the measured rate.
        pause = 0.3  # the server notices the closed connection at its next chunk
        window = min(3.0, 0.8 * (long - u["decided_at_token"]) / rate - pause)
        assert window >= 0.5, f"{rate:.0f} tokens/s leaves no window inside the answer"
        time.sleep(pause)
        after = busy_over(pid, window)
    assert after < 0.1 * window, (
        f"llama.cpp used {after:.2f} s of CPU in the {window:.1f} s after the proxy disconnected at token "
        f"{u['decided_at_token']} (decided in {took:.1f} s): it kept generating"
    )
